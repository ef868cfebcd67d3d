--[[
  purge: delete up to `limit` of the oldest jobs in a finished state.

  For completed, dead or cancelled jobs: their hashes go and they leave the
  state's zset. The running totals (completed, retried) are not changed. Their
  ids enter "tombs" (from the completed zset: still done for a later dependency)
  or "graves" (records.lua): a rehydration under way must not put them back. Call
  again while jobs remain, so one call stays short. Job hashes, tombs and graves
  are built inside.

  Input:
    KEYS[1] source  the state's zset (completed, dead or cancelled)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] limit

  Output:
    { purged, remaining }
]]
--!include records
local old = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1, 'WITHSCORES')
local gone = {}
for i = 1, #old, 2 do
  redis.call('DEL', ARGV[1] .. 'job:' .. old[i])
  gone[#gone + 1] = old[i + 1]  -- when it finished
  gone[#gone + 1] = old[i]
end
if #gone > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #gone / 2 - 1)
  local done = KEYS[1] == ARGV[1] .. 'completed'
  records_add(ARGV[1] .. (done and 'tombs' or 'graves'), gone)
end
return { #gone / 2, redis.call('ZCARD', KEYS[1]) }
