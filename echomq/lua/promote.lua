--[[
  promote: move up to pump_batch due jobs from the schedule head onto their lanes.

  Due is judged on the server clock. A promoted lane that was empty joins the
  ring; the doorbell rings once when anything was promoted. The caller parks
  until the returned next due time (both times are the server's, so hosts with
  skewed clocks agree). Job hashes and lane lists are built inside; an id
  without a hash is dropped.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] ring      list of lanes with waiting jobs
    KEYS[3] wake      the doorbell list
    KEYS[4] stats     counters (field "waiting": ids on the lanes)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] pump_batch

  Output:
    { promoted, next due time in ms or -1, server now in ms }
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local promoted = 0
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local jk = prefix .. 'job:' .. id
  local lane = redis.call('HGET', jk, 'lane')
  if lane then
    redis.call('HSET', jk, 'state', 'waiting')
    if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
      redis.call('RPUSH', KEYS[2], lane)
    end
    promoted = promoted + 1
  end
end
if promoted > 0 then
  redis.call('HINCRBY', KEYS[4], 'waiting', promoted)
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    redis.call('LPUSH', KEYS[3], '1')
    redis.call('LTRIM', KEYS[3], 0, 63)
  end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = tonumber(head[2]) end
return { promoted, next_due, now }
