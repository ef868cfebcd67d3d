--[[
  limits_restore: put back lane limits from the floor after Valkey lost them.

  A lane that has a limit in Valkey keeps it (set since the loss, it is the newer).
  Bumps the meta field "limits" when anything came back, so the scheduler copies
  the merged limits to the floor again. Refused (nothing written) unless the epoch
  key holds the caller's rehydration mark: Valkey lost its data again, and the
  rehydration starts over.

  Input:
    KEYS[1] epoch   the rehydration's mark "rehydrating-<token>"
    KEYS[2] limits  hash: lane (or "*") -> "max_active rate per_ms"
    KEYS[3] meta    queue settings hash (field "limits": a version counter)
    ARGV[1] the caller's mark
    ARGV[2..] pairs: lane, value

  Output:
    the number of limits put back (0 when refused)
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local restored = 0
for i = 2, #ARGV, 2 do
  restored = restored + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
end
if restored > 0 then redis.call('HINCRBY', KEYS[3], 'limits', 1) end
return restored
