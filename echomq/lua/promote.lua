--[[
  promote: move up to pump_batch due jobs from the schedule head onto their lanes.

  Due is judged on the server clock, to the microsecond (a relative due time's
  score keeps it, see schedule.lua). A promoted lane that was empty joins the
  ring; the doorbell rings once when anything was promoted (unless the caller
  wakes a consumer itself, ARGV[3]). The caller parks
  until the returned next due time (both times are the server's, so hosts with
  skewed clocks agree). Job hashes and lane lists are built inside; an id
  without a hash is dropped. A job with a priority above 0 goes onto its
  level's lane "lane<p>:<lane>" and ring "ring<p>" (built inside).

  Flow control: rate-limited lanes whose window opened (lane wake zset, up to
  pump_batch) go back on the rings a claim took them off (blocked set
  "<p>|<lane>"), counted with the promoted; the next due time is the earlier
  of the schedule head and the lane wake head.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] ring      list of lanes with waiting jobs
    KEYS[3] wake      the doorbell list
    KEYS[4] stats     counters (field "waiting": ids on the lanes)
    KEYS[5] prios     zset of priority levels above 0 in use
    KEYS[6] lanewake  zset of rate-limited lanes by the time their window opens (ms)
    KEYS[7] blocked   set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[8] events    capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] pump_batch
    ARGV[3] "1" (optional): ring no doorbell, the caller wakes a consumer itself

  Output:
    { promoted (jobs and opened lanes), next due time in ms or -1 (as text, to the
      microsecond), server now in ms, the microseconds past that ms (callers keep a
      timer to the head's due time) }
]]
--!include events
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exact = t[1] * 1000 + t[2] / 1000
local prefix = ARGV[1]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', exact, 'LIMIT', 0, tonumber(ARGV[2]))
local promoted = 0
local moved = 0
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'lane', 'priority')
  local lane = f[1]
  if lane then
    redis.call('HSET', jk, 'state', 'waiting')
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
    event('waiting', id, lane)
  end
end
promoted = moved
local open = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
if open[2] and tonumber(open[2]) <= now then
  local opened = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  local levels = redis.call('ZRANGE', KEYS[5], 0, -1)
  levels[#levels + 1] = '0'
  for _, lane in ipairs(opened) do
    redis.call('ZREM', KEYS[6], lane)
    for _, p in ipairs(levels) do
      if redis.call('SREM', KEYS[7], p .. '|' .. lane) == 1 then
        redis.call('RPUSH', p == '0' and KEYS[2] or prefix .. 'ring' .. p, lane)
        promoted = promoted + 1
      end
    end
  end
  open = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
end
if moved > 0 then redis.call('HINCRBY', KEYS[4], 'waiting', moved) end
if promoted > 0 and ARGV[3] ~= '1' then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[3], '1') > 64 then redis.call('LTRIM', KEYS[3], 0, 63) end
  end
end
local next_due = -1
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then next_due = tonumber(head[2]) end
if open[2] and (next_due < 0 or tonumber(open[2]) < next_due) then next_due = tonumber(open[2]) end
-- as text: a number reply would drop the microseconds, and a timer aimed at the whole
-- ms before the due time would find nothing due
flush_events(KEYS[8])  -- events
return { promoted, string.format('%.3f', next_due), now, t[2] % 1000 }
