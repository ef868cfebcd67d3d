--[[
  expire: the metronome's pass over jobs whose expiry passed before they started.

  Each id of the expiring zset scored at or before now leaves it; a job still
  waiting leaves its lane (LREM: linear in the lane's length; a lane left empty
  leaves its ring and the blocked set), a scheduled one the schedule, a spilled
  one the spilled set; each becomes state "cancelled" with error "expired", in the
  cancelled zset, its result waiter woken, its floor row closed (the closed log)
  when it was ever deferred and the queue folds, or it was spilled. Jobs in other
  states (started, finished, gone) just leave the zset. The jobs that wait for an
  expired one (after=) learn it was cancelled (deps.lua); the event stream records
  "cancelled". The job hashes, lane lists
  and rings are built inside (a job with a priority p above 0 waits on
  "lane<p>:<lane>", its lane on "ring<p>").

  Input:
    KEYS[1] expiring  zset of job ids by expiry (ms)
    KEYS[2] schedule  KEYS[3] ring   KEYS[4] cancelled  KEYS[5] stats
    KEYS[6] blocked   KEYS[7] meta   KEYS[8] closed     KEYS[9] spilled
    KEYS[10] events   capped stream of job events ("cancelled", "expired")
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] the most ids to look at

  Output:
    { jobs cancelled, the next expiry (ms) or false when none is left }
]]
--!include events
--!include deps
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local folding = nil
local expired = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'state', 'lane', 'priority', 'deferred', 'waited', 'spilled')
  local state = f[1]
  local hit = false
  if state == 'waiting' then
    local p = f[3] or '0'
    local lk, rk = prefix .. 'lane:' .. f[2], KEYS[3]
    if p ~= '0' then
      lk = prefix .. 'lane' .. p .. ':' .. f[2]
      rk = prefix .. 'ring' .. p
    end
    if redis.call('LREM', lk, 1, id) == 1 then
      hit = true
      redis.call('HINCRBY', KEYS[5], 'waiting', -1)
      if redis.call('LLEN', lk) == 0 then
        redis.call('LREM', rk, 0, f[2])
        redis.call('SREM', KEYS[6], p .. '|' .. f[2])
      end
    end
  elseif state == 'scheduled' and f[6] == '1' then
    hit = redis.call('SREM', KEYS[9], id) == 1
  elseif state == 'scheduled' then
    hit = redis.call('ZREM', KEYS[2], id) == 1
  end
  if hit then
    expired = expired + 1
    redis.call('HSET', jk, 'state', 'cancelled', 'finished_ms', now, 'token', '',
      'error', 'expired')
    event('cancelled', id, f[2], nil, 'expired')
    redis.call('ZADD', KEYS[4], now, id)
    deps_ended(prefix, now, id, 'x')  -- the jobs that wait for it (deps.lua)
    if folding == nil then
      folding = (tonumber(redis.call('HGET', KEYS[7], 'fold') or '') or 0) >= now
    end
    if f[6] == '1' or (f[4] == '1' and folding) then redis.call('RPUSH', KEYS[8], id) end
    if f[5] then
      local done = prefix .. 'done:' .. id
      redis.call('LPUSH', done, 'x')
      redis.call('PEXPIRE', done, 60000)
    end
  end
end
deps_flush(prefix)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
flush_events(KEYS[10])  -- events
return { expired, head[2] or false }
