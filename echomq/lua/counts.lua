--[[
  counts: how many jobs are in each state (read-only).

  waiting sums the lengths of the lanes on the ring, or, with ARGV[2] "fast",
  is read from the counter the scripts keep (O(1) at any number of lanes, for
  metrics scrapes); completed and dead are
  totals since the queue began (retention may have dropped completed hashes);
  spilled is how many scheduled jobs live on the floor alone; cancelled is
  how many cancelled jobs are kept (until purged). Lane lists are built
  inside.

  Input:
    KEYS[1] ring  KEYS[2] schedule  KEYS[3] leases  KEYS[4] dead  KEYS[5] stats
    KEYS[6] spilled  set of ids held by the floor alone
    KEYS[7] cancelled  KEYS[8] paused
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] optional "fast": the kept counter instead of summing the lanes

  Output:
    { waiting, scheduled, active, completed, dead, retried, spilled, lanes, cancelled,
    paused (1 or 0) }
]]
local prefix = ARGV[1]
local lanes = redis.call('LLEN', KEYS[1])
local waiting = 0
if ARGV[2] == 'fast' then
  waiting = tonumber(redis.call('HGET', KEYS[5], 'waiting') or '0')
else
  for _, lane in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    waiting = waiting + redis.call('LLEN', prefix .. 'lane:' .. lane)
  end
end
local s = redis.call('HMGET', KEYS[5], 'completed', 'retried')
local spilled = redis.call('SCARD', KEYS[6])
return { waiting, redis.call('ZCARD', KEYS[2]) + spilled, redis.call('ZCARD', KEYS[3]),
  tonumber(s[1] or '0'), redis.call('ZCARD', KEYS[4]), tonumber(s[2] or '0'), spilled, lanes,
  redis.call('ZCARD', KEYS[7]), redis.call('EXISTS', KEYS[8]) }
