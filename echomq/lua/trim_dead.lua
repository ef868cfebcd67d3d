--[[
  trim_dead: drop the oldest dead jobs beyond the queue's dead retention.

  Dead jobs past keep_count (the newest stay) or older than keep_age_ms leave
  the dead set and their hashes are deleted, at most `limit` per call so a
  call stays short. The stats field "dead_trimmed" counts them. Each dropped id
  enters "graves" (records.lua): a rehydration under way must not put it back. Job
  hashes and the graves are built inside.

  Input:
    KEYS[1] dead   zset of dead job ids by time of death (ms)
    KEYS[2] stats  counters
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] keep_count (-1: no limit)
    ARGV[3] keep_age_ms (-1: no limit)
    ARGV[4] limit

  Output:
    the number of dead jobs dropped
]]
--!include records
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local keep_count = tonumber(ARGV[2])
local keep_age = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local dropped = 0
local gone = {}
local function drop(ids)
  for _, id in ipairs(ids) do
    redis.call('DEL', prefix .. 'job:' .. id)
    redis.call('ZREM', KEYS[1], id)
    dropped = dropped + 1
    gone[#gone + 1] = now
    gone[#gone + 1] = id
  end
end
if keep_count >= 0 then
  local over = redis.call('ZCARD', KEYS[1]) - keep_count
  if over > 0 then drop(redis.call('ZRANGE', KEYS[1], 0, math.min(over, limit) - 1)) end
end
if keep_age >= 0 and dropped < limit then
  drop(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - keep_age, 'LIMIT', 0, limit - dropped))
end
if dropped > 0 then
  redis.call('HINCRBY', KEYS[2], 'dead_trimmed', dropped)
  records_add(prefix .. 'graves', gone)
end
return dropped
