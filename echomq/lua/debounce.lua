--[[
  debounce: gather adds with one debounce key into one scheduled job.

  The key's record "debounce:<key>" (built inside) names the job it gathers into.
  While that job is still scheduled (not started, not spilled), an add appends its
  payload to the job's "payloads" (a JSON array, in order), makes it the job's
  "payload", and moves the job's due time to debounce_ms after this add, never
  later than max_ms after the first add ("debounce_first_ms"); when the queue folds,
  the id goes on the fold log again, so the job's floor row is rewritten with every
  payload (a Valkey that restarts empty loses none). Otherwise (no
  record, or the job started, ended or was spilled) a new job opens under the
  given id: a scheduled job (as schedule.lua writes one, "deferred" 1, appended
  to the fold log when the queue folds) due debounce_ms from now (at most max_ms),
  and the record names it. The record expires max_ms + 1 hour after it opened.
  Rings the doorbell when the job became the schedule's head.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] wake      the doorbell list
    KEYS[3] meta      queue settings hash
    KEYS[4] fold      list of ids not yet written to the floor
    KEYS[5] events    capped stream of job events ("added" with its due time for a new
                      job, "gathered" with the new due time for a payload gathered)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] debounce key
    ARGV[3] job id for a new job
    ARGV[4] "1" when the caller chose that id (it must not name another job)
    ARGV[5] name      ARGV[6] payload (JSON)  ARGV[7] lane  ARGV[8] max_attempts
    ARGV[9] max_stalls  ARGV[10] backoff  ARGV[11] timeout_ms ('' none)
    ARGV[12] dedup_ms ('' none)  ARGV[13] trace ('' none)  ARGV[14] priority "0".."9"
    ARGV[15] debounce_ms  ARGV[16] max_ms

  Output:
    { job id, 1 opened / 0 gathered }, or an error reply
    "job id clashes" (nothing changed) when a chosen id names another job
]]
--!include events
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local exact = t[1] * 1000 + t[2] / 1000
local prefix = ARGV[1]
local dk = prefix .. 'debounce:' .. ARGV[2]
local wait = tonumber(ARGV[15])
local max = tonumber(ARGV[16])
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local head_due = head[2] and tonumber(head[2]) or nil
local function ring(due)
  if head_due ~= nil and due >= head_due then return end
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 'LT', due, '1')
  else
    if redis.call('LPUSH', KEYS[2], '1') > 64 then redis.call('LTRIM', KEYS[2], 0, 63) end
  end
end
local open = redis.call('GET', dk)
if open then
  local jk = prefix .. 'job:' .. open
  local f = redis.call('HMGET', jk, 'state', 'debounce', 'spilled', 'payloads',
    'debounce_first_ms')
  if f[1] == 'scheduled' and f[2] == ARGV[2] and f[3] ~= '1' and f[4] then
    if ARGV[4] == '1' and ARGV[3] ~= open then
      return redis.error_reply('ERR job id clashes: debounce key ' .. ARGV[2] ..
        ' gathers into job ' .. open)
    end
    local payloads = string.sub(f[4], 1, -2) .. ',' .. ARGV[6] .. ']'
    local due = math.min(exact + wait, (tonumber(f[5]) or now) + max)
    redis.call('HSET', jk, 'payload', ARGV[6], 'payloads', payloads,
      'due_ms', math.ceil(due))
    redis.call('ZADD', KEYS[1], due, open)
    if (tonumber(redis.call('HGET', KEYS[3], 'fold') or '') or 0) >= now then
      redis.call('RPUSH', KEYS[4], open)  -- its floor row gets the payloads gathered since
    end
    ring(due)
    event('gathered', open, redis.call('HGET', jk, 'lane'), nil,
      string.format('%d', math.ceil(due)))
    flush_events(KEYS[5])  -- events
    return { open, 0 }
  end
end
local id = ARGV[3]
local jk = prefix .. 'job:' .. id
if redis.call('EXISTS', jk, prefix .. 'dedup:' .. id) > 0 then
  return redis.error_reply('ERR job id clashes: job ' .. id .. ' exists')
end
local due = exact + math.min(wait, max)
redis.call('HSET', jk, 'id', id, 'name', ARGV[5], 'payload', ARGV[6], 'lane', ARGV[7],
  'state', 'scheduled', 'max_attempts', ARGV[8],
  'max_stalls', ARGV[9], 'created_ms', now, 'due_ms', math.ceil(due),
  'deferred', 1, 'payloads', '[' .. ARGV[6] .. ']', 'debounce', ARGV[2],
  'debounce_first_ms', now)
-- attempts 0, stalls 0 and no backoff are what a missing field reads as: not stored
if ARGV[10] ~= '' then redis.call('HSET', jk, 'backoff', ARGV[10]) end
if ARGV[11] ~= '' then redis.call('HSET', jk, 'timeout_ms', ARGV[11]) end
if ARGV[12] ~= '' then redis.call('HSET', jk, 'dedup_ms', ARGV[12]) end
if ARGV[13] ~= '' then redis.call('HSET', jk, 'trace', ARGV[13]) end
if ARGV[14] ~= '0' then redis.call('HSET', jk, 'priority', ARGV[14]) end
redis.call('ZADD', KEYS[1], due, id)
if (tonumber(redis.call('HGET', KEYS[3], 'fold') or '') or 0) >= now then
  redis.call('RPUSH', KEYS[4], id)
end
redis.call('SET', dk, id, 'PX', string.format('%d', max + 3600000))
ring(due)
event('added', id, ARGV[7], nil, string.format('%d', math.ceil(due)))
flush_events(KEYS[5])  -- events
return { id, 1 }
