--[[
  admit: write jobs that are claimable now and push each onto its lane.

  Idempotent per job id: an id whose hash already exists, or that is spilled
  (held by the floor alone), is left unchanged. An id still reserved by
  dedup_ms after its job completed (key "dedup:<id>", built inside) counts as
  existing; with the relay's guard, so does an outbox row a relay admitted before
  (its doorbell exists; relayguard.lua). A lane that goes from empty to
  non-empty joins the ring. Rings the doorbell once when anything was admitted,
  unless the queue is paused (nothing could claim it; resume rings instead).

  Input:
    KEYS[1] ring     list of lanes with waiting jobs
    KEYS[2] wake     the doorbell list
    KEYS[3] spilled  set of ids held by the floor alone
    KEYS[4] stats    counters (field "waiting": ids on the lanes)
    KEYS[5] paused   string, present while the queue is paused
    KEYS[6] prios    zset of priority levels above 0 in use
    KEYS[7] events   capped stream of job events
    ARGV[1] key prefix "emq:{q}:"  (job hashes and lane lists are built from it)
    ARGV[2] n, the number of jobs
    ARGV[3..] per job, 11 values: id, name, payload, lane, max_attempts, max_stalls, backoff,
              timeout_ms ('' for none), dedup_ms ('' for none), trace (a W3C traceparent or ''),
              priority ("0".."9")
    ARGV[3 + n * 11] optional: the relay's guard, ms to keep each row's "relayed" doorbell,
              then n values: each job's outbox token, then the leader lease's value the
              relay ran under ('' for none; relayguard.lua)

  Output:
    an array of n integers: 1 admitted, 0 already existed; an error reply "NOTLEADER",
    changing nothing, when the relay's leader lease is held by another (relayguard.lua)
]]
--!include events
--!include relayguard
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local n = tonumber(ARGV[2])
local out = {}
local admitted = false
local any_spilled = redis.call('EXISTS', KEYS[3]) == 1
local guard = ARGV[3 + n * 11]
if not relay_leads(guard, ARGV[4 + n * 11 + n]) then
  return redis.error_reply('NOTLEADER the relay\'s scheduler no longer leads this queue')
end
-- consecutive jobs of one plain lane go onto it with one RPUSH (a bulk add is mostly such
-- runs); a run is pushed before anything else is, so lanes join the ring in order
local run_lane, run_ids = nil, {}
local function push_run()
  if not run_lane then return end
  local lk = prefix .. 'lane:' .. run_lane
  for j = 1, #run_ids, 1000 do  -- unpack takes a few thousand values at most
    local last = math.min(j + 999, #run_ids)
    if redis.call('RPUSH', lk, unpack(run_ids, j, last)) == last - j + 1 then
      redis.call('RPUSH', KEYS[1], run_lane)  -- the lane was empty: it joins the ring
    end
  end
  run_lane, run_ids = nil, {}
end
for i = 0, n - 1 do
  local b = 3 + i * 11
  local id = ARGV[b]
  local jk = prefix .. 'job:' .. id
  local doorbell = relay_doorbell(guard, id, ARGV[4 + n * 11 + i])
  local guarded = relayed_before(doorbell)
  if guarded or redis.call('EXISTS', jk, prefix .. 'dedup:' .. id) > 0
      or (any_spilled and redis.call('SISMEMBER', KEYS[3], id) == 1) then
    out[i + 1] = 0
  else
    local lane = ARGV[b + 3]
    redis.call('HSET', jk, 'id', id, 'name', ARGV[b + 1], 'payload', ARGV[b + 2],
      'lane', lane, 'state', 'waiting', 'max_attempts', ARGV[b + 4],
      'max_stalls', ARGV[b + 5], 'created_ms', now)
    -- attempts 0, stalls 0 and no backoff are what a missing field reads as: not stored
    if ARGV[b + 6] ~= '' then redis.call('HSET', jk, 'backoff', ARGV[b + 6]) end
    if ARGV[b + 7] ~= '' then redis.call('HSET', jk, 'timeout_ms', ARGV[b + 7]) end
    if ARGV[b + 8] ~= '' then redis.call('HSET', jk, 'dedup_ms', ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then redis.call('HSET', jk, 'trace', ARGV[b + 9]) end
    local p = ARGV[b + 10]
    if p == '0' then
      if run_lane ~= lane then push_run() end
      run_lane = lane
      run_ids[#run_ids + 1] = id
    else
      push_run()
      redis.call('HSET', jk, 'priority', p)
      if redis.call('RPUSH', prefix .. 'lane' .. p .. ':' .. lane, id) == 1 then
        redis.call('RPUSH', prefix .. 'ring' .. p, lane)
        redis.call('ZADD', KEYS[6], p, p)
      end
    end
    out[i + 1] = 1
    admitted = true
    event('added', id, lane)
  end
  ring_relayed(guard, doorbell, guarded)  -- after the id's admit is written
end
push_run()
if admitted then
  local added = 0
  for i = 1, n do added = added + out[i] end
  redis.call('HINCRBY', KEYS[4], 'waiting', added)
  if redis.call('EXISTS', KEYS[5]) == 0 then
    if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
      redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
    else
      if redis.call('LPUSH', KEYS[2], '1') > 64 then redis.call('LTRIM', KEYS[2], 0, 63) end
    end
  end
end
flush_events(KEYS[7])  -- events
return out
