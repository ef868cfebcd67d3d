--[[
  retry_dead: re-admit dead jobs with fresh attempts and stalls.

  The last error stays on the job (as "error") until it runs again. A job
  that died because a dependency did (deps.lua) is re-admitted only with that
  dependency alive again (retried in this call or before): it is "blocked"
  again until the dependency completes (released at once when every one has),
  so it never runs without a dependency's result; while the dependency is still
  dead or cancelled it stays dead (not counted). Without ids (retry every dead
  job), a held job's dead dependencies are retried with it, and one that stays
  dead goes to the end of the dead set (the newest score), so batched calls move on. Job
  hashes and lane lists are built inside (a job with a priority above 0 goes
  onto "lane<p>:<lane>" and ring "ring<p>"). Rings the doorbell when anything was
  re-admitted.

  Input:
    KEYS[1] dead  KEYS[2] ring  KEYS[3] wake
    KEYS[4] stats counters (field "waiting": ids on the lanes; "dead" is a running total)
    KEYS[5] prios zset of priority levels above 0 in use
    KEYS[6] events capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] limit (used when no ids are given: the oldest dead jobs first)
    ARGV[3..] optional job ids

  Output:
    the number of jobs re-admitted
]]
--!include deps
--!include events
local prefix = ARGV[1]
local ids = {}
if #ARGV >= 3 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end
local moved = 0
local laned = 0  -- put on a lane here (deps_release counts its own)
local alive = { waiting = true, scheduled = true, active = true, blocked = true }

-- the marks of a job killed for a dependency ("fail" and a mark "d" or "x", deps.lua)
local function killed_by_dependency(jk, f)
  if not f[3] or f[4] == 'run' then return false end
  for d in string.gmatch(f[3], '%S+') do
    local mark = redis.call('HGET', jk, 'dep:' .. d)
    if mark == 'd' or mark == 'x' then return true end
  end
  return false
end

-- a job killed for a dependency waits again, when each dependency that had not completed
-- is alive again (retried): its mark goes, so that dependency's end counts (deps.lua).
-- False, nothing written, while one is still dead, cancelled or gone.
local function reblock(id)
  local jk = prefix .. 'job:' .. id
  local pending, done = {}, {}
  for d in string.gmatch(redis.call('HGET', jk, 'after'), '%S+') do
    local mark = redis.call('HGET', jk, 'dep:' .. d)
    if not mark or string.sub(mark, 1, 1) ~= 'c' then
      local g = redis.call('HMGET', prefix .. 'job:' .. d, 'state', 'result')
      if g[1] == 'completed' then
        done[#done + 1] = d
        done[#done + 1] = g[2] or 'null'
      elseif alive[g[1]] then
        pending[#pending + 1] = d
      else
        return false
      end
    end
  end
  for i = 1, #done, 2 do redis.call('HSET', jk, 'dep:' .. done[i], 'c' .. done[i + 1]) end
  for _, d in ipairs(pending) do redis.call('HDEL', jk, 'dep:' .. d) end
  redis.call('HSET', jk, 'attempts', 0, 'stalls', 0)
  redis.call('HDEL', jk, 'finished_ms')
  if #pending == 0 then
    deps_release(prefix, id)
  else
    redis.call('HSET', jk, 'state', 'blocked', 'deps_left', #pending)
    redis.call('ZADD', prefix .. 'waitdeps', redis.call('HGET', jk, 'created_ms') or 0, id)
  end
  event('retried', id, redis.call('HGET', jk, 'lane'))
  return true
end

local held = {}  -- {id, dead score}: jobs killed for a dependency, after the others
local held_at = {}  -- their ids, while held
local every = #ARGV < 3  -- no ids: every dead job (oldest first) is being retried

local function take(id)
  if redis.call('ZREM', KEYS[1], id) ~= 1 then return end
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'lane', 'priority', 'after', 'dep_fail', 'finished_ms')
  local lane = f[1]
  if lane and killed_by_dependency(jk, f) then
    held[#held + 1] = { id, f[5] or 0 }  -- its dead score is its finished time
    held_at[id] = true
  elseif lane then
    redis.call('HSET', jk, 'state', 'waiting', 'attempts', 0, 'stalls', 0)
    redis.call('HDEL', jk, 'finished_ms')
    local p = f[2] or '0'
    if p == '0' then
      if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
        redis.call('RPUSH', KEYS[2], lane)
      end
    elseif redis.call('RPUSH', prefix .. 'lane' .. p .. ':' .. lane, id) == 1 then
      redis.call('RPUSH', prefix .. 'ring' .. p, lane)
      redis.call('ZADD', KEYS[5], p, p)
    end
    moved = moved + 1
    laned = laned + 1
    event('retried', id, lane)
  end
end

for _, id in ipairs(ids) do take(id) end
-- retrying every dead job: a held job's dead dependencies come along in this call (and
-- theirs, up the graph), wherever they stand in the dead set
if every then
  local k = 1
  while k <= #held do
    local jk = prefix .. 'job:' .. held[k][1]
    for d in string.gmatch(redis.call('HGET', jk, 'after'), '%S+') do
      if redis.call('HGET', jk, 'dep:' .. d) == 'd'
          and redis.call('HGET', prefix .. 'job:' .. d, 'state') == 'dead' then
        take(d)
      end
    end
    k = k + 1
  end
end
-- down the graph: a held job whose dependency is alive again (revived before or in this
-- call) waits again, and then its own held dependents are tried: each job once per
-- dependency that came back, so the order of the ids does not matter
local work = {}
for _, h in ipairs(held) do work[#work + 1] = h[1] end
local i = 1
while i <= #work do
  local id = work[i]
  i = i + 1
  if held_at[id] and reblock(id) then
    held_at[id] = nil
    moved = moved + 1
    local more = redis.call('HGET', prefix .. 'job:' .. id, 'dependents')
    if more then
      for wid in string.gmatch(more, '%S+') do
        if held_at[wid] then work[#work + 1] = wid end
      end
    end
  end
end
-- still dead; when every dead job is being retried, at the end of the dead set, so
-- the next call of a batched retry-all goes on to the jobs after them
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
for _, h in ipairs(held) do
  local score = h[2]
  if every and last and tonumber(last) >= tonumber(score) then score = tonumber(last) + 1 end
  if held_at[h[1]] then redis.call('ZADD', KEYS[1], score, h[1]) end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], 'waiting', laned)
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[3], '1') > 64 then redis.call('LTRIM', KEYS[3], 0, 63) end
  end
end
flush_events(KEYS[6])  -- events
return moved
