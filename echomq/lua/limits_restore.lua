--[[
  limits_restore: put back lane limits from the floor after Valkey lost them.

  A lane that has a limit in Valkey keeps it (set since the loss, it is the newer).
  Bumps the meta field "limits" when anything came back, so the scheduler copies
  the merged limits to the floor again.

  Input:
    KEYS[1] limits  hash: lane (or "*") -> "max_active rate per_ms"
    KEYS[2] meta    queue settings hash (field "limits": a version counter)
    ARGV[1..] pairs: lane, value

  Output:
    the number of limits put back
]]
local restored = 0
for i = 1, #ARGV, 2 do
  restored = restored + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
if restored > 0 then redis.call('HINCRBY', KEYS[2], 'limits', 1) end
return restored
