--[[
  retry_dead: re-admit dead jobs with fresh attempts and stalls.

  The last error stays on the job (as "error") until it runs again. Job
  hashes and lane lists are built inside (a job with a priority above 0 goes
  onto "lane<p>:<lane>" and ring "ring<p>"). Rings the doorbell when anything was
  re-admitted.

  Input:
    KEYS[1] dead  KEYS[2] ring  KEYS[3] wake
    KEYS[4] stats counters (field "waiting": ids on the lanes; "dead" is a running total)
    KEYS[5] prios zset of priority levels above 0 in use
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] limit (used when no ids are given: the oldest dead jobs first)
    ARGV[3..] optional job ids

  Output:
    the number of jobs re-admitted
]]
local prefix = ARGV[1]
local ids = {}
if #ARGV >= 3 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end
local moved = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local jk = prefix .. 'job:' .. id
    local f = redis.call('HMGET', jk, 'lane', 'priority')
    local lane = f[1]
    if lane then
      redis.call('HSET', jk, 'state', 'waiting', 'attempts', 0, 'stalls', 0)
      redis.call('HDEL', jk, 'finished_ms')
      local p = f[2] or '0'
      if p == '0' then
        if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
          redis.call('RPUSH', KEYS[2], lane)
        end
      elseif redis.call('RPUSH', prefix .. 'lane' .. p .. ':' .. lane, id) == 1 then
        redis.call('RPUSH', prefix .. 'ring' .. p, lane)
        redis.call('ZADD', KEYS[5], p, p)
      end
      moved = moved + 1
    end
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], 'waiting', moved)
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    redis.call('LPUSH', KEYS[3], '1')
    redis.call('LTRIM', KEYS[3], 0, 63)
  end
end
return moved
