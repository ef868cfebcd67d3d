--[[
  purge: delete up to `limit` of the oldest jobs in a finished state.

  For completed, dead or cancelled jobs: their hashes go and they leave the
  state's zset. The running totals (completed, retried) are not changed.
  Call again while jobs remain, so one call stays short. Job hashes are built
  inside.

  Input:
    KEYS[1] source  the state's zset (completed, dead or cancelled)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] limit

  Output:
    { purged, remaining }
]]
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
for _, id in ipairs(ids) do redis.call('DEL', ARGV[1] .. 'job:' .. id) end
if #ids > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids - 1) end
return { #ids, redis.call('ZCARD', KEYS[1]) }
