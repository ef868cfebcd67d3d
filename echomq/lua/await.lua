--[[
  await: read a finished job's outcome, or mark the job as awaited so that the
  settle (or reap) that finishes it rings its result doorbell. Finished means
  completed, dead or cancelled.

  Atomic with settle: either the job is already completed/dead here, or this
  call's mark is seen by the settle that finishes it. While the job is not
  finished, any token left on its doorbell is stale (from an earlier finish
  before a retry of a dead job) and is dropped, so a waiter never wakes early.

  Input:
    KEYS[1] job hash   "emq:{q}:job:<id>"
    KEYS[2] doorbell   "emq:{q}:done:<id>"
    ARGV[1] "1" to mark a job that is not finished, "0" only to read (a waiter
            that will not park)

  Output:
    { state, result, error } when the job is finished;
    { "pending" } when it is not (marked when ARGV[1] is "1"); { "missing", outcome } when there is no
    job hash: outcome is the doorbell's token ("c"/"d") or "" when none
]]
local f = redis.call('HMGET', KEYS[1], 'state', 'result', 'error')
if not f[1] then
  return { 'missing', redis.call('LINDEX', KEYS[2], 0) or '' }
end
if f[1] == 'completed' or f[1] == 'dead' or f[1] == 'cancelled' then
  return { f[1], f[2] or '', f[3] or '' }
end
if ARGV[1] == '1' then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'waited', 1)
end
return { 'pending' }
