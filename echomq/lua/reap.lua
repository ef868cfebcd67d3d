--[[
  reap: return leased jobs to the front of their lanes.

  Without pairs: every job whose lease expired on the server clock (up to
  `limit`). With pairs: exactly those jobs, when the token still matches (a
  supervisor releasing the job of a child that died, or a consumer handing
  back jobs it claimed but never started). The mode says what the return
  costs the job:
    "stall"     stalls + 1; past max_stalls the job goes dead instead
    "requeue"   nothing (a drain that ran out of time)
    "unstarted" attempts - 1 (the job never began, or its run is not charged)
    "suspect"   as "unstarted", and marks the job to run alone until it settles:
                it was one of several running in a process that died, and which
                of them killed it is not known (a job handed back unstarted keeps
                the mark; a buried one loses it)
  Given pairs go back to the head of their lanes in the order given (the
  first pair ends up first).
  A job that was ever deferred (field "deferred") and goes back to its lane is
  appended to the fold log while the queue folds (meta "fold", a lease expiry in
  ms): a sweep after a lapse of the fold lease walks the lanes before the leases,
  so a job handed back from its lease to a lane already walked is met only by the
  fold (which writes it as it is then). A buried one is appended to the closed log.
  Rings the doorbell when any job became claimable or a slot of the queue-wide
  limit freed (the "qfull" flag claim.lua left), and a buried job's result
  doorbell "done:<id>" when a result waiter marked it; the jobs that wait for a
  buried one learn it died (deps.lua). Job hashes, lane lists
  and doorbells are built inside.

  A job with a priority above 0 goes back onto its level's lane "lane<p>:<lane>"
  and ring "ring<p>" (built inside). A job its claim counted against its lane's
  max_active (field "held") is uncounted, and its lane, if a claim took it off
  its rings at the limit (the count flagged + 10^9; blocked set "<p>|<lane>"),
  goes back on them unless
  its rate window is still closed (in the lane wake zset: promote opens it).

  Input:
    KEYS[1] leases  KEYS[2] ring  KEYS[3] wake  KEYS[4] dead  KEYS[5] stats
    KEYS[6] meta    KEYS[7] closed
    KEYS[8] prios   KEYS[9] active  KEYS[10] blocked  KEYS[11] lanewake
    KEYS[12] fold   list of ids to write to the floor
    KEYS[13] events capped stream of job events
    (stats field "waiting": ids on the lanes)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] limit
    ARGV[3] mode: "stall", "requeue", "unstarted" or "suspect"
    ARGV[4..] optional pairs: id, token

  Output:
    { requeued, buried, next lease expiry in ms or -1, server now in ms }
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local mode = ARGV[3]
-- folding while a scheduler's fold lease (meta "fold", an expiry in ms) runs
local fold = (tonumber(redis.call('HGET', KEYS[6], 'fold') or '') or 0) >= now
local ids = {}
if #ARGV >= 4 then
  -- last pair first: each LPUSH goes in front of the one before. A pair given twice
  -- counts once: every token is checked before any job is handed back
  local seen = {}
  for i = #ARGV - 1, 4, -2 do
    local tok = redis.call('HGET', prefix .. 'job:' .. ARGV[i], 'token')
    if tok and tok ~= '' and tok == ARGV[i + 1] and not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      ids[#ids + 1] = ARGV[i]
    end
  end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
end
local requeued = 0
local buried = 0
local reopened = false
local function ring_key(p)
  if p == '0' then return KEYS[2] end
  return prefix .. 'ring' .. p
end
-- a counted job of this lane ended: uncount it, and put the lane back on the rings a
-- claim took it off at its max_active (the count flagged + 10^9). A lane left with nothing
-- counted leaves the hash (the next claim counts from none), so the hash holds the lanes
-- with jobs running, not every lane that ever ran one
local function put_back(lane)
  local c = redis.call('HINCRBY', KEYS[9], lane, -1)
  local blocked = c >= 1000000000
  if blocked then c = c - 1000000000 end
  if c <= 0 then
    redis.call('HDEL', KEYS[9], lane)
  elseif blocked then
    redis.call('HSET', KEYS[9], lane, c)
  end
  if not blocked then return end
  if redis.call('ZSCORE', KEYS[11], lane) then return end
  local levels = redis.call('ZRANGE', KEYS[8], 0, -1)
  levels[#levels + 1] = '0'
  for _, p in ipairs(levels) do
    if redis.call('SREM', KEYS[10], p .. '|' .. lane) == 1 then
      redis.call('RPUSH', ring_key(p), lane)
      reopened = true
    end
  end
end
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'lane', 'stalls', 'max_stalls', 'deferred', 'waited',
    'priority', 'held')
  if f[1] then
    local p = f[6] or '0'
    local stalls = tonumber(f[2]) or 0  -- malformed counts read as missing ones
    if mode == 'stall' then stalls = stalls + 1 end
    if mode == 'stall' and stalls > (tonumber(f[3]) or 1) then
      redis.call('HSET', jk, 'state', 'dead', 'stalls', stalls, 'finished_ms', now,
        'error', 'stalled ' .. stalls .. ' times: the lease expired or the process running it died')
      redis.call('HDEL', jk, 'token', 'held', 'alone')
      redis.call('ZADD', KEYS[4], now, id)
      redis.call('HINCRBY', KEYS[5], 'dead', 1)
      if fold and f[4] == '1' then redis.call('RPUSH', KEYS[7], id) end
      if f[5] then
        redis.call('LPUSH', prefix .. 'done:' .. id, 'd')
        redis.call('PEXPIRE', prefix .. 'done:' .. id, 60000)
      end
      event('dead', id, f[1], nil, 'stalled')
      deps_ended(prefix, now, id, 'd')  -- the jobs that wait for it (deps.lua)
      buried = buried + 1
    else
      redis.call('HSET', jk, 'state', 'waiting', 'stalls', stalls)
      if mode == 'unstarted' or mode == 'suspect' then
        redis.call('HINCRBY', jk, 'attempts', -1)
      end
      if mode == 'suspect' then redis.call('HSET', jk, 'alone', '1') end
      redis.call('HDEL', jk, 'token', 'held')
      local lk = prefix .. 'lane:' .. f[1]
      if p ~= '0' then lk = prefix .. 'lane' .. p .. ':' .. f[1] end
      if redis.call('LPUSH', lk, id) == 1 then
        redis.call('RPUSH', ring_key(p), f[1])
        if p ~= '0' then redis.call('ZADD', KEYS[8], p, p) end
      end
      if fold and f[4] == '1' then redis.call('RPUSH', KEYS[12], id) end
      requeued = requeued + 1
      event(mode == 'stall' and 'stalled' or 'requeued', id, f[1])
    end
    if f[7] == '1' then put_back(f[1]) end
  end
end
if requeued > 0 then redis.call('HINCRBY', KEYS[5], 'waiting', requeued) end
-- a slot of the queue-wide limit freed (claim.lua left "qfull" when it stopped at it): a
-- job that died here rings too, or the jobs waiting behind the limit wait for nothing
if requeued + buried > 0 and redis.call('DEL', prefix .. 'qfull') == 1 then reopened = true end
if requeued > 0 or reopened then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[3], '1') > 64 then redis.call('LTRIM', KEYS[3], 0, 63) end
  end
end
deps_flush(prefix)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_expiry = -1
if head[2] then next_expiry = tonumber(head[2]) end
flush_events(KEYS[13])  -- events
return { requeued, buried, next_expiry, now }
