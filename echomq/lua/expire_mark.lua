--[[
  expire_mark: give a job just admitted its expiry (Queue.add(expires=)).

  Sent in one MULTI with the admit or schedule call, so no claim runs between the
  two. A job that already has an expiry, that is no longer waiting or scheduled, or
  that is a spilled job's stub (its expiry is on the floor) is left as it is; so is,
  when ARGV[4] is given, a job whose payload is not the one this add sent (an
  existing job under the same id, which the admit left alone, is not this add's:
  a retry of the same add is). The job's hash gets "expires_ms"
  and its id enters the expiring zset, scored by that time: claim.lua cancels a
  job met past it, and the metronome's pass (expire.lua) one still waiting or
  scheduled. The job hash is built inside.

  Input:
    KEYS[1] expiring  zset of job ids by expiry (ms)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] job id
    ARGV[3] expiry: absolute ms, or -ms from the server's clock now
    ARGV[4] optional: the SHA1 (hex) of the payload the add sent, as stored

  Output:
    1 marked, 0 left as it was
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local jk = ARGV[1] .. 'job:' .. ARGV[2]
local f = redis.call('HMGET', jk, 'state', 'expires_ms', 'spilled', 'payload')
if f[2] or f[3] == '1' or (f[1] ~= 'waiting' and f[1] ~= 'scheduled') then return 0 end
if ARGV[4] and ARGV[4] ~= '' and redis.sha1hex(f[4] or '') ~= ARGV[4] then return 0 end
local at = tonumber(ARGV[3])
if at < 0 then at = now - at end
redis.call('HSET', jk, 'expires_ms', string.format('%d', at))
redis.call('ZADD', KEYS[1], at, ARGV[2])
return 1
