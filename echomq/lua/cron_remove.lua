--[[
  cron_remove: remove a cron; occurrences already admitted stay as they are.

  Input:
    KEYS[1] crons     hash: cron key -> spec
    KEYS[2] cronlast  hash: cron key -> due time (ms) of the last occurrence admitted
    KEYS[3] meta      queue settings hash (field "crons": a version counter)
    ARGV[1] cron key

  Output:
    1 when the cron existed, 0 when not
]]
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if removed == 1 then redis.call('HINCRBY', KEYS[3], 'crons', 1) end
return removed
