--[[
  restore: bring jobs from the floor back into the schedule set.

  Used for spilled jobs coming within the horizon (mode "spilled") and for
  rehydration after Valkey lost its data (mode "all"). Idempotent: a job whose
  hash exists is left alone (it is already in Valkey), unless that hash is a
  spilled job's stub (state "scheduled", "spilled" 1; spill.lua), which the
  row's fields fill out (a result waiter's "waited" mark stays); so is a job whose
  hash is gone with its id among the tombstones or the graves (records.lua: it ended,
  and retention or purge dropped it before the beat closed its row); the schedule
  entry is added with NX. In mode "spilled" a job comes back only while its id is in
  the spilled set: one cancelled meanwhile has left it, and stays cancelled. A
  restored id leaves the spilled set. A
  restored job is "scheduled" at the given score; due ones are promoted by
  the next beat. It holds no lease token and is counted against no lane limit
  (a row folded while the job was active may carry its claim's "held" mark:
  nothing counts it now, so a settle must not uncount it). Rings the doorbell when a restored job became the head.
  A job whose row holds an expiry ("expires_ms") enters the expiring zset again, so
  the metronome's pass meets it as well as a claim (expire_mark.lua).
  Job hashes and the expiring zset are built inside.

  Input:
    KEYS[1] schedule  KEYS[2] wake  KEYS[3] spilled (set of ids held by the floor alone)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] mode: "spilled" (only ids in the spilled set) or "all" (rehydration)
    ARGV[3..] per job: id, score (ms), field count n, then n field/value pairs

  Output:
    an array with one integer per job: 1 restored, 0 already in Valkey (a live
    job, not a stub; or, mode "spilled", no longer spilled: cancelled meanwhile)
]]
--!include records
local prefix = ARGV[1]
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local head_due = head[2] and tonumber(head[2]) or nil
local new_head = false
local restored = 0
local out = {}
local i = 3
while i <= #ARGV do
  local id = ARGV[i]
  local score = tonumber(ARGV[i + 1])
  local n = tonumber(ARGV[i + 2])
  local jk = prefix .. 'job:' .. id
  local held = redis.call('HMGET', jk, 'state', 'spilled')
  local absent = (not held[1] and not record_gone(prefix, id))
    or (held[1] == 'scheduled' and held[2] == '1')
  if absent and (ARGV[2] ~= 'spilled' or redis.call('SISMEMBER', KEYS[3], id) == 1) then
    for f = 0, n - 1 do
      redis.call('HSET', jk, ARGV[i + 3 + f * 2], ARGV[i + 4 + f * 2])
    end
    redis.call('HSET', jk, 'state', 'scheduled', 'due_ms', score, 'deferred', 1)
    redis.call('HDEL', jk, 'token', 'held', 'spilled')
    redis.call('ZADD', KEYS[1], 'NX', score, id)
    local expires = tonumber(redis.call('HGET', jk, 'expires_ms') or '')
    if expires then redis.call('ZADD', prefix .. 'expiring', expires, id) end
    redis.call('SREM', KEYS[3], id)
    if head_due == nil or score < head_due then
      head_due = score
      new_head = true
    end
    restored = restored + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  i = i + 3 + n * 2
end
if new_head then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 'LT', head_due, '1')
  else
    if redis.call('LPUSH', KEYS[2], '1') > 64 then redis.call('LTRIM', KEYS[2], 0, 63) end
  end
end
return out
