--[[
  requeue: put waiting jobs back on their lanes from their floor rows, in the order
  given (rehydration under the "durable" dial, after Valkey lost its data).

  Idempotent: a job whose hash exists is left alone (it is in Valkey already), unless
  that hash is a spilled job's stub; so is a job whose hash is gone with its id among
  the tombstones or the graves (records.lua: it ended and retention or purge dropped it
  before the beat closed its row, as a job added during a rehydration can). A requeued job is "waiting" with every field of
  its row (its lease token and lane-limit mark dropped, "deferred" 1: its floor row
  stays open until it finishes) and goes to the tail of its lane (priority levels
  above 0: "lane<p>:<lane>", ring "ring<p>", level in prios); a lane that goes from
  empty to non-empty joins its ring. The waiting count grows by the jobs requeued,
  and the doorbell rings once when any was. A job whose row holds an expiry
  ("expires_ms") enters the expiring zset again (built inside), so the metronome's
  pass meets it as well as a claim.

  Input:
    KEYS[1] ring    KEYS[2] wake    KEYS[3] stats    KEYS[4] prios    KEYS[5] spilled
    KEYS[6] events  capped stream of job events ("waiting" with "restored" per job)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] per job: id, field count n, then n field/value pairs

  Output:
    an array with one integer per job: 1 requeued, 0 already in Valkey
]]
--!include events
--!include records
local prefix = ARGV[1]
local out = {}
local added = 0
local i = 2
while i <= #ARGV do
  local id = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local jk = prefix .. 'job:' .. id
  local held = redis.call('HMGET', jk, 'state', 'spilled')
  local lost = not held[1] and not record_gone(prefix, id)
  if lost or (held[1] == 'scheduled' and held[2] == '1') then
    local lane, p = 'default', '0'
    for f = 0, n - 1 do
      local k, v = ARGV[i + 2 + f * 2], ARGV[i + 3 + f * 2]
      redis.call('HSET', jk, k, v)
      if k == 'lane' then lane = v elseif k == 'priority' then p = v
      elseif k == 'expires_ms' and tonumber(v) then
        redis.call('ZADD', prefix .. 'expiring', tonumber(v), id)
      end
    end
    redis.call('HSET', jk, 'state', 'waiting', 'deferred', 1)
    redis.call('HDEL', jk, 'token', 'held', 'spilled')
    redis.call('SREM', KEYS[5], id)
    local ring, lk = KEYS[1], prefix .. 'lane:' .. lane
    if p ~= '0' then
      ring, lk = prefix .. 'ring' .. p, prefix .. 'lane' .. p .. ':' .. lane
      redis.call('ZADD', KEYS[4], p, p)
    end
    if redis.call('RPUSH', lk, id) == 1 then redis.call('RPUSH', ring, lane) end
    added = added + 1
    event('waiting', id, lane, nil, 'restored')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  i = i + 2 + n * 2
end
if added > 0 then
  redis.call('HINCRBY', KEYS[3], 'waiting', added)
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[2], '1') > 64 then redis.call('LTRIM', KEYS[2], 0, 63) end
  end
end
flush_events(KEYS[6])  -- events
return out
