--[[
  limits_read: the lane limits and their version, for the scheduler's floor copy,
  only while Valkey still holds the data of the epoch the caller knows.

  An empty limits hash after Valkey lost its data must not reach the floor as "no
  limits": the read is refused unless the epoch key holds the caller's epoch, and
  while the version is absent (no limit set, cleared or restored since Valkey's data
  began: a rehydration by a scheduler that restores no limits leaves it so).

  Input:
    KEYS[1] epoch   set by the scheduler; gone means Valkey lost its data
    KEYS[2] limits  hash: lane (or "*") -> "max_active rate per_ms"
    KEYS[3] meta    queue settings hash (field "limits": a version counter)
    ARGV[1] the epoch the caller read

  Output:
    false when the epoch differs or no version is set; else { version, flat lane, value list }
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local version = redis.call('HGET', KEYS[3], 'limits')
if not version then return false end
return { version, redis.call('HGETALL', KEYS[2]) }
