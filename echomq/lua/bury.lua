--[[
  bury: set aside jobs that cannot run as they are (a malformed due time in the
  hash, a floor row that does not parse): dead at once, with the reason.

  The job leaves the schedule set and the spilled set. A job whose hash is gone
  (it lived on the floor alone) gets a small hash holding its id, the state and
  the reason (name "(unknown)", lane "default"), so it shows among the dead; a
  spilled job's stub loses its "spilled" mark (its row is closed with it). A
  result waiter (the job's "waited" mark) is woken through "done:<id>"; the jobs
  that wait for it learn it died (deps.lua). Job
  hashes and doorbells are built inside.

  Input:
    KEYS[1] schedule  KEYS[2] dead  KEYS[3] stats  KEYS[4] spilled
    KEYS[5] events    capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] pairs: id, reason

  Output:
    the number of jobs buried
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local buried = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local jk = ARGV[1] .. 'job:' .. id
  redis.call('ZREM', KEYS[1], id)
  redis.call('SREM', KEYS[4], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HSET', jk, 'id', id, 'state', 'dead', 'finished_ms', now, 'error', ARGV[i + 1],
    'token', '')
  redis.call('HSETNX', jk, 'name', '(unknown)')
  redis.call('HSETNX', jk, 'lane', 'default')
  redis.call('HDEL', jk, 'spilled')
  redis.call('ZADD', KEYS[2], now, id)
  if redis.call('HEXISTS', jk, 'waited') == 1 then
    local done = ARGV[1] .. 'done:' .. id
    redis.call('LPUSH', done, 'd')
    redis.call('PEXPIRE', done, 60000)
  end
  event('dead', id, redis.call('HGET', jk, 'lane'), nil, 'buried')
  deps_ended(ARGV[1], now, id, 'd')  -- its dependents (deps.lua)
  buried = buried + 1
end
deps_flush(ARGV[1])
if buried > 0 then redis.call('HINCRBY', KEYS[3], 'dead', buried) end
flush_events(KEYS[5])  -- events
return buried
