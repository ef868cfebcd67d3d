--[[
  cron_restore: put back crons from the floor after Valkey lost them.

  A cron Valkey still holds keeps its spec (it may have been replaced since the
  floor's copy); its last occurrence becomes the later of the two, so an
  occurrence either side recorded is not admitted again.

  Input:
    KEYS[1] crons     hash: cron key -> spec
    KEYS[2] cronlast  hash: cron key -> due time (ms) of the last occurrence admitted
    KEYS[3] meta      queue settings hash (field "crons": a version counter)
    ARGV[1..] triples: cron key, spec (JSON), last (ms)

  Output:
    the number of crons put back
]]
local restored, changed = 0, false
for i = 1, #ARGV, 3 do
  local key, last = ARGV[i], tonumber(ARGV[i + 2])
  if redis.call('HSETNX', KEYS[1], key, ARGV[i + 1]) == 1 then
    restored = restored + 1
    changed = true
  end
  local cur = tonumber(redis.call('HGET', KEYS[2], key) or '') or 0
  if last > cur then
    redis.call('HSET', KEYS[2], key, ARGV[i + 2])
    changed = true
  end
end
if changed then redis.call('HINCRBY', KEYS[3], 'crons', 1) end
return restored
