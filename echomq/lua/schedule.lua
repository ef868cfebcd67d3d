--[[
  schedule: write deferred jobs and add them to the schedule set by due time.

  Idempotent per job id, like admit (a spilled id, or one reserved by dedup_ms,
  counts as taken; with the relay's guard, so does an outbox row a relay admitted
  before: relayguard.lua). Due time is the server clock plus the delay, or an absolute
  time when one is given. A relative due time keeps the clock's microseconds in
  the score, so the job starts at its due time, not at the next whole millisecond; the hash's due_ms (and the floor's copy) is that
  time rounded up, so a job restored from it never starts early. When the queue folds onto a
  floor (meta field "fold", a lease expiry in ms, not yet passed), each new id is appended to the fold log.
  Rings the doorbell only when a new job became the schedule's head, so a
  parked metronome re-computes its wait; otherwise nobody needs waking.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] wake      the doorbell list
    KEYS[3] meta      queue settings hash
    KEYS[4] fold      list of ids not yet written to the floor
    KEYS[5] spilled   set of ids held by the floor alone
    KEYS[6] events    capped stream of job events
    ARGV[1] key prefix "emq:{q}:"  (job hashes are built from it)
    ARGV[2] n, the number of jobs
    ARGV[3..] per job, 12 values: id, name, payload, lane, max_attempts, max_stalls,
              backoff, timeout_ms ('' for none), dedup_ms ('' for none),
              trace (a W3C traceparent or ''), priority ("0".."9", kept in the hash
              for promote), due (">=0": absolute ms; "-<d>": d ms from now)
    ARGV[3 + n * 12] optional: the relay's guard, ms to keep each row's "relayed" doorbell,
              then n values: each job's outbox token, then the leader lease's value the
              relay ran under ('' for none; relayguard.lua)

  Output:
    an array of n integers: 1 scheduled, 0 already existed;
    an error reply "invalid due time", changing nothing, when a due time is not an
    integer or would fall after 10^14 - 1 ms (it could not be stored as integer text);
    an error reply "NOTLEADER", changing nothing, when the relay's leader lease is held
    by another (relayguard.lua)
]]
--!include events
--!include relayguard
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- the server clock in ms to the microsecond: a relative due time's score
local exact = t[1] * 1000 + t[2] / 1000
local prefix = ARGV[1]
local n = tonumber(ARGV[2])
local max_due = 99999999999999
local guard = ARGV[3 + n * 12]
if not relay_leads(guard, ARGV[4 + n * 12 + n]) then
  return redis.error_reply('NOTLEADER the relay\'s scheduler no longer leads this queue')
end
for i = 0, n - 1 do
  local raw = ARGV[3 + i * 12 + 11]
  local due = tonumber(raw)
  if not due or due ~= due or due ~= math.floor(due) or due > max_due
      or (due < 0 and exact - due > max_due) then
    return redis.error_reply('ERR invalid due time ' .. raw .. ' for job ' .. ARGV[3 + i * 12])
  end
end
-- folding while a scheduler's fold lease (meta "fold", an expiry in ms) runs
local fold = (tonumber(redis.call('HGET', KEYS[3], 'fold') or '') or 0) >= now
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local head_due = head[2] and tonumber(head[2]) or nil
local new_head = false
local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 12
  local id = ARGV[b]
  local jk = prefix .. 'job:' .. id
  local doorbell = relay_doorbell(guard, id, ARGV[4 + n * 12 + i])
  local guarded = relayed_before(doorbell)
  if guarded or redis.call('EXISTS', jk, prefix .. 'dedup:' .. id) > 0
      or redis.call('SISMEMBER', KEYS[5], id) == 1 then
    out[i + 1] = 0
  else
    local due = tonumber(ARGV[b + 11])
    local due_ms = due
    if due < 0 then
      due = exact - due
      due_ms = math.ceil(due)
    end
    redis.call('HSET', jk, 'id', id, 'name', ARGV[b + 1], 'payload', ARGV[b + 2],
      'lane', ARGV[b + 3], 'state', 'scheduled', 'max_attempts', ARGV[b + 4],
      'max_stalls', ARGV[b + 5], 'created_ms', now, 'due_ms', due_ms, 'deferred', 1)
    -- attempts 0, stalls 0 and no backoff are what a missing field reads as: not stored
    if ARGV[b + 6] ~= '' then redis.call('HSET', jk, 'backoff', ARGV[b + 6]) end
    if ARGV[b + 7] ~= '' then redis.call('HSET', jk, 'timeout_ms', ARGV[b + 7]) end
    if ARGV[b + 8] ~= '' then redis.call('HSET', jk, 'dedup_ms', ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then redis.call('HSET', jk, 'trace', ARGV[b + 9]) end
    if ARGV[b + 10] ~= '0' then redis.call('HSET', jk, 'priority', ARGV[b + 10]) end
    redis.call('ZADD', KEYS[1], due, id)
    if fold then redis.call('RPUSH', KEYS[4], id) end
    if head_due == nil or due < head_due then
      head_due = due
      new_head = true
    end
    out[i + 1] = 1
    event('added', id, ARGV[b + 3], nil, due_ms)
  end
  ring_relayed(guard, doorbell, guarded)  -- after the id's admit is written
end
if new_head then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 'LT', head_due, '1')
  else
    if redis.call('LPUSH', KEYS[2], '1') > 64 then redis.call('LTRIM', KEYS[2], 0, 63) end
  end
end
flush_events(KEYS[6])  -- events
return out
