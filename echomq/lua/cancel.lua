--[[
  cancel: withdraw a job that has not started.

  A waiting job leaves its lane (LREM: linear in that lane's length; a lane
  left empty leaves the ring); a scheduled job leaves the schedule. Either
  becomes state "cancelled", kept in the cancelled zset by cancel time until
  purged. A job that was ever deferred is appended to the closed log when
  the queue folds, so the scheduler drops its floor row. Active, finished and
  unknown jobs are left alone. A result waiter (the job's "waited" mark) is woken
  through the job's doorbell "done:<id>". The job hash, lane list and that
  doorbell are built inside (a job with a priority above 0 waits on
  "lane<p>:<lane>", its lane on "ring<p>"). A lane left empty also leaves the
  blocked set (flow control), so it is not put back on a ring later.

  A scheduled job spilled to the floor (its stub: "spilled" 1, spill.lua; or,
  spilled before stubs, no hash and its id in the spilled set) leaves the
  spilled set, which is what fences it from a restore (restore.lua brings a
  spilled job back only while its id is there). Its stub becomes the cancelled
  record and keeps "spilled" 1 (its other fields are on the floor); a job with
  no hash gets a small one (name "(unknown)", lane "default", "spilled" 1). Its
  id is always appended to the closed log, so the scheduler drops its floor row.

  Input:
    KEYS[1] schedule   zset of deferred job ids by due time (ms)
    KEYS[2] ring       list of lanes with waiting jobs
    KEYS[3] cancelled  zset of cancelled job ids by cancel time (ms)
    KEYS[4] meta       queue settings hash (field "fold": the scheduler's lease expiry, ms)
    KEYS[5] closed     list of ids whose floor rows to close
    KEYS[6] stats      counters (field "waiting": ids on the lanes)
    KEYS[7] spilled    set of ids held by the floor alone
    KEYS[8] blocked    set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[9] events     capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] job id

  Output:
    1 cancelled, 0 no such job, 2 refused: active, 3 refused: already finished
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local id = ARGV[2]
local jk = prefix .. 'job:' .. id
local f = redis.call('HMGET', jk, 'state', 'lane', 'deferred', 'waited', 'priority', 'spilled')
local state = f[1]
if not state then
  if redis.call('SREM', KEYS[7], id) == 0 then return 0 end
  redis.call('HSET', jk, 'id', id, 'name', '(unknown)', 'lane', 'default', 'state', 'cancelled',
    'finished_ms', now, 'error', 'cancelled', 'deferred', 1, 'spilled', 1)
  redis.call('ZADD', KEYS[3], now, id)
  redis.call('RPUSH', KEYS[5], id)  -- a spilled job means a floor, whatever the fold lease
  event('cancelled', id, 'default')
  flush_events(KEYS[9])  -- events
  return 1
end
if state == 'active' then return 2 end
if state == 'waiting' then
  local p = f[5] or '0'
  local lk = prefix .. 'lane:' .. f[2]
  local rk = KEYS[2]
  if p ~= '0' then
    lk = prefix .. 'lane' .. p .. ':' .. f[2]
    rk = prefix .. 'ring' .. p
  end
  redis.call('LREM', lk, 1, id)
  if redis.call('LLEN', lk) == 0 then
    redis.call('LREM', rk, 0, f[2])
    redis.call('SREM', KEYS[8], p .. '|' .. f[2])
  end
  redis.call('HINCRBY', KEYS[6], 'waiting', -1)
elseif state == 'scheduled' and f[6] == '1' then
  redis.call('SREM', KEYS[7], id)
elseif state == 'scheduled' then
  redis.call('ZREM', KEYS[1], id)
elseif state == 'blocked' then  -- waits for dependencies (deps.lua)
  redis.call('ZREM', prefix .. 'waitdeps', id)
  redis.call('HDEL', jk, 'deps_left')
else
  return 3
end
redis.call('HSET', jk, 'state', 'cancelled', 'finished_ms', now, 'token', '',
  'error', 'cancelled')  -- not the error of an earlier failed attempt
redis.call('ZADD', KEYS[3], now, id)
event('cancelled', id, f[2])
if f[6] == '1' then
  redis.call('RPUSH', KEYS[5], id)  -- a spilled job means a floor, whatever the fold lease
elseif f[3] == '1' and (tonumber(redis.call('HGET', KEYS[4], 'fold') or '') or 0) >= now then
  redis.call('RPUSH', KEYS[5], id)
end
if f[4] then
  local done = prefix .. 'done:' .. id
  redis.call('LPUSH', done, 'x')
  redis.call('PEXPIRE', done, 60000)
end
deps_ended(prefix, now, id, 'x')  -- the jobs that wait for it (deps.lua)
deps_flush(prefix)
flush_events(KEYS[9])  -- events
return 1
