--[[
  deps: the fan-in of job dependencies, a library the scripts that end a job
  include (settle, bury, reap, cancel) and the blocked admit (block.lua) uses.
  A loader replaces the line "--!include deps" of those scripts with this text.

  A blocked job (state "blocked", in the "waitdeps" zset by created time) holds
  "after" (its dependency ids, space-separated, in the order given), "deps_left"
  (how many have not ended yet) and "dep_fail" ("fail" or "run"). A job others
  wait for holds "dependents" (their ids, space-separated). When a dependency
  ends, each blocked dependent gets the mark "dep:<id>" (HSETNX: the first end of
  that dependency counts, a later one never does): "c" and the result text for a
  completed one, "d" dead, "x" cancelled. A completion (or any end, for "run")
  counts "deps_left" down; at 0 the job enters its lane like an admitted one and
  the doorbell rings once per script call, unless the queue is paused. A dead or
  cancelled dependency of a "fail" job ends it dead ("dependency <id> dead" or
  "... cancelled"), and its own dependents in turn, down the graph. Every key is
  built inside from the queue's prefix: one queue, one hash slot.
  A "collect" job (dep_fail "collect": a workflow's result record, a group's list)
  never runs: released, it completes at once with the JSON list of its dependencies'
  results in "after" order (its "result"), enters the completed zset (retention counts
  from there, at the next settle's trim) and rings its result doorbell; a dead or
  cancelled dependency ends it dead as "fail" does.
  Events (events.lua, which the including script includes first, and flushes): a
  released job "waiting" with "unblocked", a job ended by a dependency "dead" with that
  reason, a collect job "completed".

  On the floor: a blocked job held by it (field "deferred" 1) is appended to the
  fold log when a dependency's end marks it, so its row keeps the marks (the
  results it waits with); ended dead, to the closed log. Both while the queue
  folds (meta "fold", a lease expiry in ms). A job a rehydration is rebuilding
  (field "reblock" 1, see reblock.lua) is skipped: its fan-in is counted there.
]]
local deps_rang = false

-- true while a scheduler's fold lease (meta "fold", an expiry in ms) runs
local function deps_folding(prefix, now)
  return (tonumber(redis.call('HGET', prefix .. 'meta', 'fold') or '') or 0) >= now
end

local function deps_flush(prefix)
  if not deps_rang or redis.call('EXISTS', prefix .. 'paused') == 1 then return end
  if redis.call('HGET', prefix .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', prefix .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', prefix .. 'wake', '1') > 64 then redis.call('LTRIM', prefix .. 'wake', 0, 63) end
  end
end

-- a collect job whose dependencies all completed: its result is their results' list
local function deps_collect(prefix, id, jk, lane)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local parts = {}
  for d in string.gmatch(redis.call('HGET', jk, 'after') or '', '%S+') do
    local text = string.sub(redis.call('HGET', jk, 'dep:' .. d) or 'c', 2)
    parts[#parts + 1] = text ~= '' and text or 'null'
  end
  redis.call('HSET', jk, 'state', 'completed', 'finished_ms', now,
    'result', '[' .. table.concat(parts, ',') .. ']')
  redis.call('HDEL', jk, 'deps_left')
  redis.call('ZREM', prefix .. 'waitdeps', id)
  redis.call('ZADD', prefix .. 'completed', now, id)
  if redis.call('HEXISTS', jk, 'waited') == 1 then
    redis.call('LPUSH', prefix .. 'done:' .. id, 'c')
    redis.call('PEXPIRE', prefix .. 'done:' .. id, 60000)
  end
  event('completed', id, lane)
end

-- a job whose dependencies all ended goes onto its lane as admit.lua would put it (event
-- "waiting" "unblocked", unless `quiet`: block.lua notes its own "added"); a collect job
-- completes instead
local function deps_release(prefix, id, quiet)
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'lane', 'priority', 'dep_fail')
  local lane, p = f[1], f[2] or '0'
  if f[3] == 'collect' then return deps_collect(prefix, id, jk, lane) end
  redis.call('HSET', jk, 'state', 'waiting')
  redis.call('HDEL', jk, 'deps_left')
  redis.call('ZREM', prefix .. 'waitdeps', id)
  if p == '0' then
    if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
      redis.call('RPUSH', prefix .. 'ring', lane)
    end
  elseif redis.call('RPUSH', prefix .. 'lane' .. p .. ':' .. lane, id) == 1 then
    redis.call('RPUSH', prefix .. 'ring' .. p, lane)
    redis.call('ZADD', prefix .. 'prios', p, p)
  end
  redis.call('HINCRBY', prefix .. 'stats', 'waiting', 1)
  deps_rang = true
  if not quiet then event('waiting', id, lane, nil, 'unblocked') end
end

-- a blocked job ends dead because a dependency did
local function deps_kill(prefix, now, id, why)
  local jk = prefix .. 'job:' .. id
  redis.call('HSET', jk, 'state', 'dead', 'finished_ms', now, 'error', why)
  event('dead', id, redis.call('HGET', jk, 'lane'), nil, why)
  redis.call('HDEL', jk, 'deps_left')
  redis.call('ZREM', prefix .. 'waitdeps', id)
  redis.call('ZADD', prefix .. 'dead', now, id)
  redis.call('HINCRBY', prefix .. 'stats', 'dead', 1)
  if redis.call('HGET', jk, 'deferred') == '1' and deps_folding(prefix, now) then
    redis.call('RPUSH', prefix .. 'closed', id)  -- its floor row closes
  end
  if redis.call('HEXISTS', jk, 'waited') == 1 then
    redis.call('LPUSH', prefix .. 'done:' .. id, 'd')
    redis.call('PEXPIRE', prefix .. 'done:' .. id, 60000)
  end
end

-- job `id` ended: outcome "c" (with its result text), "d" dead or "x" cancelled.
-- `dependents`: its "dependents" field when the caller read it already (a completed job
-- retention deletes at once), else nil and it is read here.
local function deps_ended(prefix, now, id, outcome, result, dependents)
  if dependents == nil then
    dependents = redis.call('HGET', prefix .. 'job:' .. id, 'dependents')
  end
  if not dependents then return end
  local work = { { id, dependents, outcome, result } }
  while #work > 0 do
    local item = table.remove(work)
    local dep, oc = item[1], item[3]
    local mark = oc == 'c' and ('c' .. (item[4] or 'null')) or oc
    for wid in string.gmatch(item[2], '%S+') do
      local wk = prefix .. 'job:' .. wid
      local g = redis.call('HMGET', wk, 'state', 'dep_fail', 'dependents', 'deferred',
        'reblock')
      if g[1] == 'blocked' and not g[5]
          and redis.call('HSETNX', wk, 'dep:' .. dep, mark) == 1 then
        if g[4] == '1' and deps_folding(prefix, now) then
          redis.call('RPUSH', prefix .. 'fold', wid)  -- its row keeps the mark
        end
        if oc ~= 'c' and g[2] ~= 'run' then
          deps_kill(prefix, now, wid,
            'dependency ' .. dep .. (oc == 'x' and ' cancelled' or ' dead'))
          if g[3] then work[#work + 1] = { wid, g[3], 'd' } end
        elseif redis.call('HINCRBY', wk, 'deps_left', -1) <= 0 then
          deps_release(prefix, wid)
        end
      end
    end
  end
end
