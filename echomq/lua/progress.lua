--[[
  progress: record a running job's progress and push its lease expiry forward.

  Only while the job's hash still holds the given token (the job is still
  this consumer's); otherwise nothing changes. The job hash is built inside.

  Input:
    KEYS[1] leases  zset of active job ids by lease expiry (ms)
    KEYS[2] events  capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] lease_ms
    ARGV[3] job id
    ARGV[4] token
    ARGV[5] progress value (JSON text)

  Output:
    1 recorded, 0 stale token
]]
--!include events
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local jk = ARGV[1] .. 'job:' .. ARGV[3]
if ARGV[4] == '' or redis.call('HGET', jk, 'token') ~= ARGV[4] then
  return 0
end
redis.call('HSET', jk, 'progress', ARGV[5])
event('progress', ARGV[3], redis.call('HGET', jk, 'lane'), nil, ARGV[5])
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[3])
flush_events(KEYS[2])  -- events
return 1
