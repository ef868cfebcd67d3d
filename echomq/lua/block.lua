--[[
  block: admit jobs that wait for other jobs (dependencies, workflows).

  Every dependency must be a job that exists (in Valkey: its hash) or one this
  call admits before the job naming it, or a completed job whose record retention
  dropped (its id in "tombs", settle.lua; built inside: it counts as done, result
  null); ARGV's checks list ids a later call of
  the same batch names, checked here first. One unknown id fails the call with
  "unknown dependency <id>" before anything is written: nothing is admitted.
  So does a dependency spilled to the floor (due beyond the spill horizon, its
  hash a stub): "spilled dependency <id>".
  A job whose id exists (or is reserved by dedup) is left unchanged (0), as in
  admit.lua; an id dedup reserves without a record cannot be waited for ("unknown
  dependency"). A dependency listed twice is waited for once. A dependency already completed counts as done (its result is
  copied into the job's mark "dep:<id>"); one dead or cancelled ends a "fail"
  job dead at once ("dependency <id> dead"), a "run" job counts it done. A job
  with nothing left to wait for enters its lane now; the others are "blocked"
  (see deps.lua for the fields and the fan-in). The doorbell rings once when a
  job entered a lane, unless the queue is paused. A job left blocked is held by
  the floor like a deferred one: field "deferred" 1 (as schedule.lua marks every
  deferred job), and while the queue folds onto a floor (meta "fold", a lease
  expiry in ms, not yet passed) its id appended to the fold log; admitted while
  nobody folds, the next leader's sweep of waitdeps folds it. Job hashes, lanes
  and rings are built inside from the prefix.
  Events: "blocked" for a job admitted to wait, "added" for one that entered its lane
  at once, "added" then "dead" (the reason) for one a failed dependency ended.

  Input:
    KEYS[1] waitdeps  zset of blocked job ids by created time (ms)
    KEYS[2] events    capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] n, the number of jobs
    ARGV[3] batch: a token shared by the calls of one pipeline ('' for a lone call); a
            call that refuses marks it ("refused:<batch>", a minute, built inside), and
            a later call of the batch then refuses too ("batch refused"), writing nothing
    ARGV[4] m, the number of outside dependencies to check
    ARGV[5..4+3m] per outside dependency of the batch (this call and the later calls
    of one pipeline), 3 values: its id (it must exist), how many jobs of the batch wait
    for it, and the longest chain of the batch's jobs hanging below it
    then per job: the 11 values of admit.lua (id, name, payload, lane, max_attempts,
    max_stalls, backoff, timeout_ms, dedup_ms, trace, priority), dep_fail ("fail" or
    "run"), k, and k dependency ids

  Limits, checked before anything is written: at most 1000 jobs wait for one job
  ("too many dependents <id>") and a blocked job sits at most 1000 deep in a chain of
  blocked jobs ("too deep <id>"; its "depth" field: 1 + its deepest pending dependency's).
  So one completion releases, and one death ends in a row, at most 1000 jobs.

  Output:
    an array of n integers: 1 admitted, 0 already existed; or the error
    "unknown dependency <id>", "spilled dependency <id>", "too many dependents <id>"
    or "too deep <id>"
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local n = tonumber(ARGV[2])
local batch = ARGV[3]
local m = tonumber(ARGV[4])
-- a refusal (nothing written) marks the batch, so its later calls write nothing either
local function refuse(text)
  if batch ~= '' then redis.call('SET', prefix .. 'refused:' .. batch, '1', 'PX', 60000) end
  return redis.error_reply(text)
end
if batch ~= '' and redis.call('EXISTS', prefix .. 'refused:' .. batch) == 1 then
  return redis.error_reply('batch refused')
end
local function exists(id)
  return redis.call('EXISTS', prefix .. 'job:' .. id) == 1
end
-- a completed job whose record retention dropped (settle.lua's tombstones)
local function tomb(id)
  return redis.call('ZSCORE', prefix .. 'tombs', id) ~= false
end
local MAX_DEPENDENTS = 1000  -- jobs waiting for one job (echomq.depend.MAX_DEPENDENTS)
local MAX_DEPTH = 1000  -- blocked jobs in a chain (echomq.depend.MAX_DEPTH)
-- how many jobs wait for d now, and its depth: a blocked job's "depth" (1 + its deepest
-- pending dependency's), 0 for any other job. A death ends at most MAX_DEPTH jobs in a
-- row, and a completion releases at most MAX_DEPENDENTS, in one call.
local function standing(d)
  local f = redis.call('HMGET', prefix .. 'job:' .. d, 'state', 'dependents', 'depth')
  local count = f[2] and select(2, string.gsub(f[2], '%S+', '')) or 0
  return count, f[1] == 'blocked' and (tonumber(f[3]) or 1) or 0, f[1]
end
local function too_many(d) return refuse('too many dependents ' .. d) end
local function too_deep(d) return refuse('too deep ' .. d) end
for i = 5, 2 + 3 * m, 3 do  -- the batch's outside dependencies, with its totals
  local d = ARGV[i]
  if not exists(d) and not tomb(d) then return refuse('unknown dependency ' .. d) end
  local count, depth = standing(d)
  if count + tonumber(ARGV[i + 1]) > MAX_DEPENDENTS then return too_many(d) end
  if depth + tonumber(ARGV[i + 2]) > MAX_DEPTH then return too_deep(d) end
end
-- first pass: every dependency is known and within the limits, before anything is written
local mine, depths, adding, new, known = {}, {}, {}, {}, {}
local b = 5 + 3 * m
for i = 1, n do
  local k = tonumber(ARGV[b + 12])
  local depth, listed = 0, {}
  for j = b + 13, b + 12 + k do
    local d = ARGV[j]
    if not mine[d] and not exists(d) and not tomb(d) then
      return refuse('unknown dependency ' .. d)
    elseif not mine[d] and redis.call('HGET', prefix .. 'job:' .. d, 'spilled') == '1' then
      return refuse('spilled dependency ' .. d)  -- its record is on the floor
    end
    if not listed[d] then
      listed[d] = true
      local dd, state = new[d], 'new'
      if dd == nil then
        known[d], dd, state = standing(d)
      end
      local ended = not state or state == 'completed' or state == 'dead' or state == 'cancelled'
      if not ended and dd + 1 > depth then depth = dd + 1 end
      adding[d] = (adding[d] or 0) + 1
    end
  end
  if depth > MAX_DEPTH then return too_deep(ARGV[b]) end
  depths[i] = depth
  -- an id dedup reserves (its record gone) is not admitted here: nothing may wait for it
  local id = ARGV[b]
  if not exists(id) and redis.call('EXISTS', prefix .. 'dedup:' .. id) == 0 then new[id] = depth end
  if exists(id) or redis.call('EXISTS', prefix .. 'dedup:' .. id) == 0 then mine[id] = true end
  b = b + 13 + k
end
for d, more in pairs(adding) do
  local count = new[d] and 0 or known[d] or standing(d)
  if count + more > MAX_DEPENDENTS then return too_many(d) end
end
local out = {}
local adds, order = {}, {}  -- dependency id -> the ids that now wait for it
b = 5 + 3 * m
for i = 1, n do
  local id = ARGV[b]
  local jk = prefix .. 'job:' .. id
  local k = tonumber(ARGV[b + 12])
  if redis.call('EXISTS', jk, prefix .. 'dedup:' .. id) > 0 then
    out[i] = 0
  else
    local dep_fail = ARGV[b + 11]
    local after, listed = {}, {}
    for j = b + 13, b + 12 + k do  -- each dependency once: it ends (and counts) once
      if not listed[ARGV[j]] then
        listed[ARGV[j]] = true
        after[#after + 1] = ARGV[j]
      end
    end
    redis.call('HSET', jk, 'id', id, 'name', ARGV[b + 1], 'payload', ARGV[b + 2],
      'lane', ARGV[b + 3], 'state', 'blocked', 'max_attempts', ARGV[b + 4],
      'max_stalls', ARGV[b + 5], 'created_ms', now, 'dep_fail', dep_fail)
    -- attempts 0, stalls 0 and no backoff are what a missing field reads as: not stored
    if ARGV[b + 6] ~= '' then redis.call('HSET', jk, 'backoff', ARGV[b + 6]) end
    if k > 0 then redis.call('HSET', jk, 'after', table.concat(after, ' ')) end
    if ARGV[b + 7] ~= '' then redis.call('HSET', jk, 'timeout_ms', ARGV[b + 7]) end
    if ARGV[b + 8] ~= '' then redis.call('HSET', jk, 'dedup_ms', ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then redis.call('HSET', jk, 'trace', ARGV[b + 9]) end
    if ARGV[b + 10] ~= '0' then redis.call('HSET', jk, 'priority', ARGV[b + 10]) end
    local pending, failed = {}, nil
    for _, d in ipairs(after) do
      local f = redis.call('HMGET', prefix .. 'job:' .. d, 'state', 'result')
      if f[1] == 'completed' then
        redis.call('HSET', jk, 'dep:' .. d, 'c' .. (f[2] or 'null'))
      elseif not f[1] and not mine[d] then  -- a tombstone: done, its result is gone
        redis.call('HSET', jk, 'dep:' .. d, 'cnull')
      elseif f[1] == 'dead' or f[1] == 'cancelled' then
        local oc = f[1] == 'dead' and 'd' or 'x'
        redis.call('HSET', jk, 'dep:' .. d, oc)
        if not failed then failed = { d, f[1] } end
      else
        pending[#pending + 1] = d
      end
    end
    if failed and dep_fail ~= 'run' then
      event('added', id, ARGV[b + 3])
      redis.call('ZADD', KEYS[1], now, id)  -- deps_kill takes it off again
      deps_kill(prefix, now, id, 'dependency ' .. failed[1] .. ' ' .. failed[2])
    elseif #pending == 0 then
      deps_release(prefix, id, true)
      event('added', id, ARGV[b + 3])
    else
      redis.call('HSET', jk, 'deps_left', #pending, 'depth', depths[i])
      redis.call('ZADD', KEYS[1], now, id)
      event('blocked', id, ARGV[b + 3])
      redis.call('HSET', jk, 'deferred', 1)  -- folded now, or by a lapse's sweep
      if deps_folding(prefix, now) then
        redis.call('RPUSH', prefix .. 'fold', id)
      end
      for _, d in ipairs(pending) do
        if not adds[d] then
          adds[d] = {}
          order[#order + 1] = d
        end
        adds[d][#adds[d] + 1] = id
      end
    end
    out[i] = 1
  end
  b = b + 13 + k
end
for _, d in ipairs(order) do
  local dk = prefix .. 'job:' .. d
  local known = redis.call('HGET', dk, 'dependents')
  local more = table.concat(adds[d], ' ')
  redis.call('HSET', dk, 'dependents', known and (known .. ' ' .. more) or more)
end
deps_flush(prefix)
flush_events(KEYS[2])  -- events
return out
