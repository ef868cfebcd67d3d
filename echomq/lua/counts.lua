--[[
  counts: how many jobs are in each state (read-only).

  waiting sums the lengths of the lanes on the ring, or, with ARGV[2] "fast",
  is read from the counter the scripts keep (O(1) at any number of lanes, for
  metrics scrapes); completed and dead are
  totals since the queue began (retention may have dropped completed hashes);
  spilled is how many scheduled jobs live on the floor alone; cancelled is
  how many cancelled jobs are kept (until purged). Lane lists are built
  inside. Summing covers the rings of priority levels above 0 ("ring<p>",
  lanes "lane<p>:<lane>") and the lanes a limit took off their rings (the
  blocked set); lanes counts the entries of every ring and the blocked set.

  Input:
    KEYS[1] ring  KEYS[2] schedule  KEYS[3] leases  KEYS[4] dead  KEYS[5] stats
    KEYS[6] spilled  set of ids held by the floor alone
    KEYS[7] cancelled  KEYS[8] paused
    KEYS[9] prios    zset of priority levels above 0 in use
    KEYS[10] blocked set of "<p>|<lane>" taken off ring <p> at a limit
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] optional "fast": the kept counter instead of summing the lanes

  Output:
    { waiting, scheduled, active, completed, dead, retried, spilled, lanes, cancelled,
    paused (1 or 0), blocked (jobs waiting for dependencies) }
]]
local prefix = ARGV[1]
local lanes = redis.call('LLEN', KEYS[1])
local levels = redis.call('ZRANGE', KEYS[9], 0, -1)
for _, p in ipairs(levels) do lanes = lanes + redis.call('LLEN', prefix .. 'ring' .. p) end
local blocked = redis.call('SCARD', KEYS[10])
lanes = lanes + blocked
local waiting = 0
local function lane_key(p, lane)
  if p == '0' then return prefix .. 'lane:' .. lane end
  return prefix .. 'lane' .. p .. ':' .. lane
end
if ARGV[2] == 'fast' then
  waiting = tonumber(redis.call('HGET', KEYS[5], 'waiting') or '0')
else
  for _, lane in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    waiting = waiting + redis.call('LLEN', prefix .. 'lane:' .. lane)
  end
  for _, p in ipairs(levels) do
    for _, lane in ipairs(redis.call('LRANGE', prefix .. 'ring' .. p, 0, -1)) do
      waiting = waiting + redis.call('LLEN', lane_key(p, lane))
    end
  end
  for _, entry in ipairs(blocked > 0 and redis.call('SMEMBERS', KEYS[10]) or {}) do
    local bar = string.find(entry, '|', 1, true)
    waiting = waiting + redis.call('LLEN', lane_key(string.sub(entry, 1, bar - 1),
      string.sub(entry, bar + 1)))
  end
end
local s = redis.call('HMGET', KEYS[5], 'completed', 'retried')
local spilled = redis.call('SCARD', KEYS[6])
return { waiting, redis.call('ZCARD', KEYS[2]) + spilled, redis.call('ZCARD', KEYS[3]),
  tonumber(s[1] or '0'), redis.call('ZCARD', KEYS[4]), tonumber(s[2] or '0'), spilled, lanes,
  redis.call('ZCARD', KEYS[7]), redis.call('EXISTS', KEYS[8]),
  redis.call('ZCARD', prefix .. 'waitdeps') }
