--[[
  reblock: bring blocked jobs back from their floor rows after Valkey lost its data
  (the scheduler's rehydration), their fan-in rebuilt, in two steps.

  Mode "hold" (during the walk over the floor): each job whose hash is gone (and
  whose id is not among the tombstones or the graves, records.lua: it ended, retention
  or purge dropped it) gets
  every field of its row, state "blocked", "deferred" 1 (its row stays open until
  it ends) and the mark "reblock" 1, and enters the waitdeps zset by its created
  time; its lease fields and count are dropped. Nothing is counted yet: a held job
  is skipped by the fan-in of ending jobs (deps.lua).
  Mode "fanin" (once every open row is back): for each held job, each dependency
  not marked already ("dep:<id>" from its row) is looked up: completed, dead or
  cancelled, as block.lua counts them; gone with its id among the graves (it died or
  was cancelled during the rehydration, its record dropped since) counts as dead;
  otherwise gone (its row was closed: it ended before the loss) counts as
  completed, its result unknown (null); any other state is
  waited for (the job joins its "dependents" once). The job then waits, enters its
  lane, or ends dead ("dependency <id> dead"), its own dependents in turn. The
  doorbell rings once when a job entered a lane, unless the queue is paused.
  Idempotent: a job not held (a live one, or one done already) is left alone.

  Input:
    KEYS[1] waitdeps  zset of blocked job ids by created time (ms)
    ARGV[1] key prefix "emq:{q}:" (its "events" stream gets the releases' events)
    ARGV[2] mode: "hold" or "fanin"
    ARGV[3..] "hold": per job: id, field count n, then n field/value pairs;
              "fanin": job ids

  Output:
    an array with one integer per job: 1 held (or rebuilt), 0 left alone
]]
--!include events
--!include deps
--!include records
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local out = {}
if ARGV[2] == 'hold' then
  local i = 3
  while i <= #ARGV do
    local id = ARGV[i]
    local n = tonumber(ARGV[i + 1])
    local jk = prefix .. 'job:' .. id
    if redis.call('EXISTS', jk) == 0 and not record_gone(prefix, id) then
      local created = now
      for f = 0, n - 1 do
        local k, v = ARGV[i + 2 + f * 2], ARGV[i + 3 + f * 2]
        redis.call('HSET', jk, k, v)
        if k == 'created_ms' then created = tonumber(v) or now end
      end
      redis.call('HSET', jk, 'state', 'blocked', 'deferred', 1, 'reblock', 1)
      redis.call('HDEL', jk, 'token', 'held', 'spilled', 'deps_left')
      redis.call('ZADD', KEYS[1], created, id)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
    i = i + 2 + n * 2
  end
  return out
end
for i = 3, #ARGV do
  local id = ARGV[i]
  local jk = prefix .. 'job:' .. id
  local h = redis.call('HMGET', jk, 'state', 'reblock', 'after', 'dep_fail')
  if h[1] == 'blocked' and h[2] == '1' then
    redis.call('HDEL', jk, 'reblock')
    local pending, failed = {}, nil
    for d in string.gmatch(h[3] or '', '%S+') do
      local mark = redis.call('HGET', jk, 'dep:' .. d)
      if not mark then
        local dk = prefix .. 'job:' .. d
        local f = redis.call('HMGET', dk, 'state', 'result', 'dependents')
        if not f[1] and redis.call('ZSCORE', prefix .. 'graves', d) ~= false then
          mark = 'd'  -- it died (or was cancelled) meanwhile, its record dropped since
        elseif not f[1] or f[1] == 'completed' then
          mark = 'c' .. (f[2] or 'null')
        elseif f[1] == 'dead' then
          mark = 'd'
        elseif f[1] == 'cancelled' then
          mark = 'x'
        else
          pending[#pending + 1] = d
          local known = ' ' .. (f[3] or '') .. ' '
          if not string.find(known, ' ' .. id .. ' ', 1, true) then
            redis.call('HSET', dk, 'dependents', f[3] and (f[3] .. ' ' .. id) or id)
          end
        end
        if mark then redis.call('HSET', jk, 'dep:' .. d, mark) end
      end
      if mark and mark ~= 'd' and mark ~= 'x' then
        -- counted done
      elseif mark and not failed then
        failed = { d, mark == 'd' and 'dead' or 'cancelled' }
      end
    end
    if failed and h[4] ~= 'run' then
      deps_kill(prefix, now, id, 'dependency ' .. failed[1] .. ' ' .. failed[2])
      deps_ended(prefix, now, id, 'd', nil)
    elseif #pending == 0 then
      deps_release(prefix, id)
    else
      redis.call('HSET', jk, 'deps_left', #pending)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
deps_flush(prefix)
flush_events(prefix .. 'events')  -- jobs released by the rebuilt fan-in (same slot)
return out
