--[[
  records: finished jobs whose records are gone (a library, "--!include records").

  A completed job that retention or purge dropped leaves its id in "tombs" (it still
  counts as done for a later dependency, block.lua); a dead or cancelled one that the
  dead retention or purge dropped, in "graves". Each zset (score: when it finished or
  was dropped, ms; built inside; written by settle, trim_dead and purge) keeps its
  newest RECORDS_MAX. A rehydration under way (requeue.lua, restore.lua, reblock.lua,
  spill.lua) leaves a job whose hash is gone and whose id is in either: it ended before
  its floor row closed, and would run again.
]]
local RECORDS_MAX = 100000  -- echomq.depend.TOMBSTONES

local function records_add(zset, pairs)  -- pairs: score, id, score, id, ...
  for s = 1, #pairs, 1000 do  -- unpack takes a few thousand values at most
    redis.call('ZADD', zset, unpack(pairs, s, math.min(s + 999, #pairs)))
  end
  local over = redis.call('ZCARD', zset) - RECORDS_MAX
  if over > 0 then redis.call('ZREMRANGEBYRANK', zset, 0, over - 1) end
end

local function record_gone(prefix, id)  -- finished, its record dropped since
  return redis.call('ZSCORE', prefix .. 'tombs', id) ~= false
    or redis.call('ZSCORE', prefix .. 'graves', id) ~= false
end
