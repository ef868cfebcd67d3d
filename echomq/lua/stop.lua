--[[
  stop: cancel an active job (its handler is still running somewhere).

  The job becomes state "cancelled" with error "cancelled while running" and an
  empty token (the lease's token is kept as "stopped_token", so a consumer that
  claimed the job but holds it in no process yet can tell its claim), so the settle its consumer writes when the handler ends matches
  no token and is refused: the job is never completed nor retried. A settle that
  ran first left the job finished, and this script refuses it in turn: a job
  ends one way only, whichever script runs first. The lease goes; a job its
  claim counted against its lane's max_active (field "held") is uncounted and
  its lane, if a claim took it off its rings at the limit, goes back on them
  (the doorbell rings), as settle does. A job that was ever deferred is
  appended to the closed log when the queue folds. A result waiter is woken
  through "done:<id>". The job id is then published on the stop channel, where
  the supervisor and standalone consumers that hold the job learn to end its
  handler. The jobs that wait for it (after=) learn it was cancelled (deps.lua), and
  the event stream records "cancelled". The job hash, lane rings and doorbells are
  built inside.

  Input:
    KEYS[1] leases    zset of active job ids by lease expiry (ms)
    KEYS[2] cancelled zset of cancelled job ids by cancel time (ms)
    KEYS[3] active    hash: lane -> counted active jobs, + 10^9 while blocked
    KEYS[4] blocked   set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[5] ring      list of lanes with waiting jobs (priority 0)
    KEYS[6] prios     zset of priority levels above 0 in use
    KEYS[7] lanewake  zset of rate-limited lanes by the time their window opens
    KEYS[8] wake      the doorbell list
    KEYS[9] meta      queue settings hash (field "fold": the scheduler's lease expiry)
    KEYS[10] closed   list of ids whose floor rows to close
    KEYS[11] events   capped stream of job events ("cancelled", "cancelled while running")
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] job id
    ARGV[3] the stop channel
    ARGV[4] error text

  Output:
    1 cancelled, 0 no such job, 2 not active (nothing changed)
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local id = ARGV[2]
local jk = prefix .. 'job:' .. id
local f = redis.call('HMGET', jk, 'state', 'lane', 'held', 'deferred', 'waited', 'token')
if not f[1] then return 0 end
if f[1] ~= 'active' then return 2 end
local rang = false
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', jk, 'state', 'cancelled', 'finished_ms', now, 'token', '', 'held', '0',
  'error', ARGV[4], 'stopped_token', f[6] or '')
redis.call('HDEL', jk, 'alone')
redis.call('ZADD', KEYS[2], now, id)
event('cancelled', id, f[2], nil, ARGV[4])
if f[3] == '1' then
  local lane = f[2]
  local c = redis.call('HINCRBY', KEYS[3], lane, -1)
  local blocked = c >= 1000000000
  if blocked then c = c - 1000000000 end
  if c <= 0 then
    redis.call('HDEL', KEYS[3], lane)
  elseif blocked then
    redis.call('HSET', KEYS[3], lane, c)
  end
  if blocked and not redis.call('ZSCORE', KEYS[7], lane) then
    local levels = redis.call('ZRANGE', KEYS[6], 0, -1)
    levels[#levels + 1] = '0'
    local back = false
    for _, p in ipairs(levels) do
      if redis.call('SREM', KEYS[4], p .. '|' .. lane) == 1 then
        redis.call('RPUSH', p == '0' and KEYS[5] or prefix .. 'ring' .. p, lane)
        back = true
      end
    end
    rang = rang or back
  end
end
if f[4] == '1' and (tonumber(redis.call('HGET', KEYS[9], 'fold') or '') or 0) >= now then
  redis.call('RPUSH', KEYS[10], id)
end
if f[5] then
  local done = prefix .. 'done:' .. id
  redis.call('LPUSH', done, 'x')
  redis.call('PEXPIRE', done, 60000)
end
-- a slot freed: the lane's, or the queue-wide limit's (claim.lua left "qfull")
if redis.call('DEL', prefix .. 'qfull') == 1 then rang = true end
if rang then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[8], '1') > 64 then redis.call('LTRIM', KEYS[8], 0, 63) end
  end
end
deps_ended(prefix, now, id, 'x')  -- the jobs that wait for it (deps.lua)
deps_flush(prefix)
redis.call('PUBLISH', ARGV[3], id)
flush_events(KEYS[11])  -- events
return 1
