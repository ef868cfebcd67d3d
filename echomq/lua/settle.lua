--[[
  settle: finish leased jobs, each with the token its claim issued.

  A token that no longer matches the job's hash (the lease expired and the job
  was handed to another consumer, or it was already settled) is refused and
  changes nothing: no zombie acks. Outcomes:
    "c" completed: the lease is dropped; the job is kept in the completed zset
        or deleted, per retention (keep_count / keep_age_ms; -1 = no limit).
    "f" failed: when attempts remain, the job is scheduled again at
        now + retry_ms (state "scheduled", ringing when it becomes the schedule
        head, appended to the fold log when the queue folds); otherwise dead.
    "d" dead at once (an unknown handler, a corrupt payload).
  A settled job's token is set empty (no token matches it again), and its
  run-alone mark (claim.lua) goes: its run ended without killing its process. A finished
  job that was ever deferred is appended to the closed log when the
  queue folds, so the floor drops its row. A completed or dead job that a
  result waiter marked ("waited") rings its result doorbell "done:<id>" with
  "c" or "d", kept a minute (waiters that come later read the job itself); a
  completed job with dedup_ms reserves its id in "dedup:<id>" that long. Job hashes, doorbells
  and dedup keys are built inside.
  Tombstones: a completed job whose record retention drops (at once for keep 0, or by
  the trims) leaves its id in "tombs" (zset, finished ms, built inside, capped to the
  newest 100,000; records.lua), so a later dependency on it counts as done (block.lua).

  Flow control: a job its claim counted against its lane's max_active (field
  "held") is uncounted, and its lane, if a claim took it off its rings at the
  limit (the count flagged + 10^9; blocked set "<p>|<lane>"), goes back on
  them (rings of levels above 0,
  "ring<p>", built inside) and the doorbell rings; a lane whose rate window is
  still closed (in the lane wake zset) is left for promote to open.

  Input:
    KEYS[1] leases     KEYS[2] schedule  KEYS[3] dead    KEYS[4] completed
    KEYS[5] wake       KEYS[6] stats     KEYS[7] meta    KEYS[8] fold
    KEYS[9] closed     KEYS[10] ring     KEYS[11] prios  KEYS[12] active
    KEYS[13] blocked   KEYS[14] lanewake
    KEYS[15] events    capped stream of job events
  Dependencies (deps.lua, included): a job's first completion, or its death, ends it
  for the jobs that wait for it (the fan-in); a stale token counts nothing.
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] keep_count   ARGV[3] keep_age_ms
    ARGV[4] n, the number of jobs
    ARGV[5..] per job, 5 values: id, token, outcome, text (result or error), retry_ms

  Output:
    an array of n codes: 0 stale token, 1 completed, 2 retrying, 3 dead
]]
--!include events
--!include deps
--!include records
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local keep_count = tonumber(ARGV[2])
local keep_age = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
-- folding while a scheduler's fold lease (meta "fold", an expiry in ms) runs
local fold = (tonumber(redis.call('HGET', KEYS[7], 'fold') or '') or 0) >= now
local out = {}
local completed = 0
local unleased = {}  -- ids whose lease ends here: one ZREM for the call
local finished = {}  -- now, id pairs of completed jobs kept: one ZADD for the call
local gone = {}  -- finished ms, id pairs of completed jobs retention dropped (tombstones)

-- unpack takes a few thousand values at most: a long argument list goes in slices
local function sliced(command, key, values)
  for i = 1, #values, 1000 do
    redis.call(command, key, unpack(values, i, math.min(i + 999, #values)))
  end
end
local function ring_done(id, outcome)
  local done = prefix .. 'done:' .. id
  redis.call('LPUSH', done, outcome)
  redis.call('PEXPIRE', done, 60000)
end
local rang = false
local reopened = false
-- a counted job of this lane ended: uncount it, and put the lane back on the rings a
-- claim took it off at its max_active (the count flagged + 10^9). A lane left with nothing
-- counted leaves the hash (the next claim counts from none), so the hash holds the lanes
-- with jobs running, not every lane that ever ran one
local function put_back(lane)
  local c = redis.call('HINCRBY', KEYS[12], lane, -1)
  local blocked = c >= 1000000000
  if blocked then c = c - 1000000000 end
  if c <= 0 then
    redis.call('HDEL', KEYS[12], lane)
  elseif blocked then
    redis.call('HSET', KEYS[12], lane, c)
  end
  if not blocked then return end
  if redis.call('ZSCORE', KEYS[14], lane) then return end
  local levels = redis.call('ZRANGE', KEYS[11], 0, -1)
  levels[#levels + 1] = '0'
  for _, p in ipairs(levels) do
    if redis.call('SREM', KEYS[13], p .. '|' .. lane) == 1 then
      redis.call('RPUSH', p == '0' and KEYS[10] or prefix .. 'ring' .. p, lane)
      reopened = true
    end
  end
end
for i = 0, n - 1 do
  local b = 5 + i * 5
  local id = ARGV[b]
  local jk = prefix .. 'job:' .. id
  -- "dependents" read here, before retention may delete the hash (deps.lua)
  local f = redis.call('HMGET', jk, 'token', 'attempts', 'max_attempts', 'deferred', 'waited',
    'dedup_ms', 'lane', 'held', 'alone', 'dependents')
  if f[1] ~= ARGV[b + 1] or ARGV[b + 1] == '' then
    out[i + 1] = 0
  else
    unleased[#unleased + 1] = id
    local dependents = f[10]
    if f[8] == '1' then put_back(f[7]) end
    if f[9] then redis.call('HDEL', jk, 'alone') end
    local outcome = ARGV[b + 2]
    if outcome == 'f' and (tonumber(f[2]) or 0) < (tonumber(f[3]) or 1) then
      local due = now + math.min(tonumber(ARGV[b + 4]) or 0, 3155760000000)  -- <= 100 years
      redis.call('HSET', jk, 'state', 'scheduled', 'due_ms', due, 'error', ARGV[b + 3],
        'deferred', 1, 'token', '', 'held', '0')
      redis.call('ZADD', KEYS[2], due, id)
      if fold then redis.call('RPUSH', KEYS[8], id) end
      local head = redis.call('ZRANGE', KEYS[2], 0, 0)
      if head[1] == id then rang = due end
      redis.call('HINCRBY', KEYS[6], 'retried', 1)
      event('failed', id, f[7], f[2], due)
      out[i + 1] = 2
    elseif outcome == 'c' then
      completed = completed + 1
      if keep_count == 0 or keep_age == 0 then
        redis.call('DEL', jk)
        gone[#gone + 1] = now
        gone[#gone + 1] = id
      else
        redis.call('HSET', jk, 'state', 'completed', 'finished_ms', now, 'result', ARGV[b + 3],
          'token', '')
        finished[#finished + 1] = now
        finished[#finished + 1] = id
      end
      if fold and f[4] == '1' then redis.call('RPUSH', KEYS[9], id) end
      local dedup = tonumber(f[6])  -- a malformed or out-of-range value reserves nothing
      if dedup and dedup >= 1 and dedup < 1e13 and dedup == math.floor(dedup) then
        redis.call('SET', prefix .. 'dedup:' .. id, '1', 'PX', string.format('%d', dedup))
      end
      if f[5] then ring_done(id, 'c') end
      -- its event before its dependents' (deps.lua notes theirs)
      event('completed', id, f[7], f[2])
      if dependents then deps_ended(prefix, now, id, 'c', ARGV[b + 3], dependents) end
      out[i + 1] = 1
    else
      redis.call('HSET', jk, 'state', 'dead', 'finished_ms', now, 'error', ARGV[b + 3],
        'token', '', 'held', '0')
      redis.call('ZADD', KEYS[3], now, id)
      redis.call('HINCRBY', KEYS[6], 'dead', 1)
      if fold and f[4] == '1' then redis.call('RPUSH', KEYS[9], id) end
      if f[5] then ring_done(id, 'd') end
      event('dead', id, f[7], f[2])
      if dependents then deps_ended(prefix, now, id, 'd', nil, dependents) end
      out[i + 1] = 3
    end
  end
end
sliced('ZREM', KEYS[1], unleased)
-- a claim cut short by the queue-wide max_active (claim.lua) waits for a slot: ring
if #unleased > 0 and redis.call('DEL', prefix .. 'qfull') == 1 then reopened = true end
sliced('ZADD', KEYS[4], finished)
if completed > 0 then
  redis.call('HINCRBY', KEYS[6], 'completed', completed)
  -- retention: trim at most 1000 old completed jobs per call, so a call stays short
  -- (keep 0: what a workflow's result record left in the zset goes now)
  local limit = keep_count
  if keep_count == 0 or keep_age == 0 then limit = 0 end
  if limit >= 0 then
    local over = redis.call('ZCARD', KEYS[4]) - limit
    if over > 0 then
      if over > 1000 then over = 1000 end
      local old = redis.call('ZRANGE', KEYS[4], 0, over - 1, 'WITHSCORES')
      local keys = {}
      for i = 1, #old, 2 do
        keys[#keys + 1] = prefix .. 'job:' .. old[i]
        gone[#gone + 1] = old[i + 1]
        gone[#gone + 1] = old[i]
      end
      redis.call('DEL', unpack(keys))
      redis.call('ZREMRANGEBYRANK', KEYS[4], 0, over - 1)
    end
  end
  if keep_age > 0 then
    local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - keep_age, 'WITHSCORES',
      'LIMIT', 0, 1000)
    for i = 1, #old, 2 do
      redis.call('DEL', prefix .. 'job:' .. old[i])
      redis.call('ZREM', KEYS[4], old[i])
      gone[#gone + 1] = old[i + 1]
      gone[#gone + 1] = old[i]
    end
  end
end
-- tombstones: a completed job retention dropped still counts as done for a later
-- add(after=...) (block.lua), for as long as it is among the newest (records.lua)
if #gone > 0 then records_add(prefix .. 'tombs', gone) end
if rang then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 'LT', rang, '1')
  else
    if redis.call('LPUSH', KEYS[5], '1') > 64 then redis.call('LTRIM', KEYS[5], 0, 63) end
  end
end
if reopened then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[5], '1') > 64 then redis.call('LTRIM', KEYS[5], 0, 63) end
  end
end
deps_flush(prefix)
flush_events(KEYS[15])  -- events
return out
