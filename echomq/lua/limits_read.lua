--[[
  limits_read: the lane limits and their version, for the scheduler's floor copy,
  only while Valkey still holds the data of the epoch the caller knows.

  An empty limits hash after Valkey lost its data must not reach the floor as "no
  limits": the read is refused unless the epoch key holds the caller's epoch.

  Input:
    KEYS[1] epoch   set by the scheduler; gone means Valkey lost its data
    KEYS[2] limits  hash: lane (or "*") -> "max_active rate per_ms"
    KEYS[3] meta    queue settings hash (field "limits": a version counter)
    ARGV[1] the epoch the caller read

  Output:
    false when the epoch differs; else { version or "", flat lane, value list }
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
return { redis.call('HGET', KEYS[3], 'limits') or '', redis.call('HGETALL', KEYS[2]) }
