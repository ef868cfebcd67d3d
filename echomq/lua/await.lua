--[[
  await: read a finished job's outcome, or mark the job as awaited so that the
  settle (or reap) that finishes it rings its result doorbell.

  Atomic with settle: either the job is already completed/dead here, or this
  call's mark is seen by the settle that finishes it. While the job is not
  finished, any token left on its doorbell is stale (from an earlier finish
  before a retry of a dead job) and is dropped, so a waiter never wakes early.

  Input:
    KEYS[1] job hash   "emq:{q}:job:<id>"
    KEYS[2] doorbell   "emq:{q}:done:<id>"

  Output:
    { state, result, error } when the job is completed or dead;
    { "pending" } after marking it; { "missing", outcome } when there is no
    job hash: outcome is the doorbell's token ("c"/"d") or "" when none
]]
local f = redis.call('HMGET', KEYS[1], 'state', 'result', 'error')
if not f[1] then
  return { 'missing', redis.call('LINDEX', KEYS[2], 0) or '' }
end
if f[1] == 'completed' or f[1] == 'dead' then
  return { f[1], f[2] or '', f[3] or '' }
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'waited', 1)
return { 'pending' }
