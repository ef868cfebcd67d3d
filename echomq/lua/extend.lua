--[[
  extend: push the lease expiry of running jobs to lease_ms from now.

  Only a job whose hash still holds the given token is extended; the others
  were reaped or settled meanwhile. Job hashes are built inside.

  Input:
    KEYS[1] leases  zset of active job ids by lease expiry (ms)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] lease_ms
    ARGV[3..] pairs: id, token

  Output:
    an array with one integer per pair: 1 extended, 0 stale token
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local expiry = now + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if ARGV[i + 1] ~= '' and redis.call('HGET', ARGV[1] .. 'job:' .. id, 'token') == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
