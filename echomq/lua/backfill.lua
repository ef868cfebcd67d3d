--[[
  backfill: give a job cancelled while spilled the fields its floor row kept.

  cancel.lua leaves such a job with a small hash (name "(unknown)", lane
  "default", "spilled" 1); before the scheduler drops the floor row it copies
  the row's fields in, so the cancelled job shows its name, lane and payload.
  Only a hash still so marked, and still cancelled, is touched (one purged
  meanwhile is not recreated); the cancel's own fields (state, finished_ms,
  error, token) are kept, and the mark is removed. Job hashes are built inside.

  Input:
    KEYS[1] cancelled  zset of cancelled job ids (the queue's slot)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] per job: id, field count n, then n field/value pairs

  Output:
    the number of hashes filled
]]
local keep = { state = true, finished_ms = true, error = true, token = true, spilled = true }
local filled = 0
local i = 2
while i <= #ARGV do
  local id = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local jk = ARGV[1] .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'state', 'spilled')
  if f[1] == 'cancelled' and f[2] == '1' and redis.call('ZSCORE', KEYS[1], id) then
    for p = 0, n - 1 do
      local field = ARGV[i + 2 + p * 2]
      if not keep[field] then
        redis.call('HSET', jk, field, ARGV[i + 3 + p * 2])
      end
    end
    redis.call('HDEL', jk, 'spilled')
    filled = filled + 1
  end
  i = i + 2 + n * 2
end
return filled
