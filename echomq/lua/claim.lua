--[[
  claim (Lanes.claim): lease up to `count` waiting jobs, one lane per turn.

  Each turn rotates the ring (LMOVE head to tail) and pops the oldest id of
  that lane, so a lane with 10,000 jobs and a lane with 1 alternate. A lane
  left empty leaves the ring. Each claimed job gets attempts + 1, a fresh
  lease token and a lease in the leases zset, expiring lease_ms from the
  server's clock. Ids whose hash is missing are dropped; a job past its "expires_ms"
  is not leased but cancelled with error "expired" (in the cancelled zset, out of the
  expiring zset, its waiter woken, its floor row closed, its event recorded, the jobs
  that wait for it told (deps.lua); keys built from the prefix). A job marked to run
  alone (released as a suspect of a process crash, see reap.lua) says so in
  its reply; the mark stays until the job settles, so one handed back before it
  ran (a stop, a crash of another job) still runs alone. With the chain
  flag, the doorbell rings when lanes still hold work after the claim, so a
  burst admitted with one ring wakes parked consumers one after another
  instead of one consumer taking it all. A paused queue (the pause flag
  exists) hands out nothing, and so does a queue with no lane on any ring, after one
  command. The lane list and the job hash are built from
  the prefix inside the script. With a claimer name, the ids and tokens
  handed out are also appended to "<prefix>claims:<claimer>" (the newest
  `keep` pairs kept, expiring ten leases after the last claim, so that it
  outlives an outage that outlived the leases): a supervisor whose consumer
  died before it could record a claim's reply hands those jobs back at once,
  uncharged, instead of waiting for their leases to expire. A claimer the
  supervisor retired once its consumer died ("<prefix>retired:<claimer>", set by
  retire.lua as it reads the record) claims nothing: a claim that consumer sent
  before it died, run only now, must not lease jobs no process holds.

  Flow control (only when the limits hash or the priority set exists; a queue
  using neither runs the loop above and nothing else): the rings of priority
  levels above 0 ("ring<p>", lanes "lane<p>:<lane>", built inside) are served
  first, highest first, each round-robin. A lane at its max_active, or whose
  rate window is full, leaves the ring it was met on and is recorded in the
  blocked set as "<p>|<lane>"; settle, reap and release put it back when one
  of its counted jobs ends, and promote when its rate window opens (the lane
  wake zset, scored by that time; the doorbell rings when it becomes the
  earliest wake, so a parked metronome re-computes its wait). Lanes taken off
  do not count as turns; after 1000 in one call the claim stops and rings when
  lanes remain, so the next claim goes on. A job claimed
  from a lane with a max_active is counted in the active hash (plus 10^9
  while the lane is blocked at its limit) and marked "held" 1 (0 when the queue has limits but not for its lane); a start of a
  rate-limited lane is logged in "starts:<lane>" (expiring with its window).

  Input:
    KEYS[1] ring      list of lanes with waiting jobs (priority 0)
    KEYS[2] leases    zset of active job ids by lease expiry (ms)
    KEYS[3] tokens    lease token counter (kept at or past the server clock in us)
    KEYS[4] wake      the doorbell list
    KEYS[5] stats     counters (field "waiting": ids on the lanes)
    KEYS[6] paused    string, present while the queue is paused
    KEYS[7] limits    hash: lane (or "*", the default) -> "max_active rate per_ms"
                      ('-' for a part not set) or "max_active" alone
    KEYS[8] prios     zset of priority levels above 0 in use
    KEYS[9] active    hash: lane -> counted active jobs, + 10^9 while blocked at max_active
    KEYS[10] blocked  set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[11] lanewake zset of rate-limited lanes by the time their window opens (ms)
    KEYS[12] schedule zset of deferred job ids by due time (ms)
    KEYS[13] events   capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] lease_ms
    ARGV[3] count, the most jobs to claim
    ARGV[4] chain: "1" to ring when work remains after this claim
    ARGV[5] claimer: the consumer's name, '' for no record (optional)
    ARGV[6] keep: the most pairs the record keeps (with a claimer)

  Output:
    a flat array, 12 values per claimed job:
    id, token, name, payload, lane, attempts, max_attempts, backoff, created_ms,
    timeout_ms ('' when the job has no time limit of its own), trace ('' for none),
    alone ('1' when the job must run with no other job beside it in its process)
]]
--!include events
--!include deps
-- no lane on any ring (the plain ring and the priority levels' set both gone): nothing to
-- claim, one command (the claim written behind a parked pop runs at each block's end)
if redis.call('EXISTS', KEYS[1], KEYS[8]) == 0 then return {} end
if redis.call('EXISTS', KEYS[6]) == 1 then return {} end
if ARGV[5] and ARGV[5] ~= '' and redis.call('EXISTS', ARGV[1] .. 'retired:' .. ARGV[5]) == 1 then
  return {}  -- its consumer died: nobody would run, extend or hand back what it leased
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local expiry = now + tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local out = {}
local claimed = 0
local turns = 0
local token_base = nil  -- one INCRBY reserves the tokens of the whole batch
local record = {}  -- id, token pairs for the claimer's record
local leased = {}  -- expiry, id pairs for the leases zset (one ZADD for the claim)

-- unpack takes a few thousand values at most: a long argument list goes in slices
local function sliced(command, key, values)
  for i = 1, #values, 1000 do
    redis.call(command, key, unpack(values, i, math.min(i + 999, #values)))
  end
end
local popped = 0
local remains = false
local skipped_out = false

-- a popped job past its expiry (Queue.add(expires=)) never starts: cancelled, "expired"
local function expire(id, jk, lane)
  local g = redis.call('HMGET', jk, 'deferred', 'waited')
  event('cancelled', id, lane, nil, 'expired')
  redis.call('HSET', jk, 'state', 'cancelled', 'finished_ms', now, 'token', '', 'error', 'expired')
  redis.call('ZADD', prefix .. 'cancelled', now, id)
  redis.call('ZREM', prefix .. 'expiring', id)
  if g[1] == '1' and (tonumber(redis.call('HGET', prefix .. 'meta', 'fold') or '') or 0) >= now then
    redis.call('RPUSH', prefix .. 'closed', id)
  end
  if g[2] then
    redis.call('LPUSH', prefix .. 'done:' .. id, 'x')
    redis.call('PEXPIRE', prefix .. 'done:' .. id, 60000)
  end
  deps_ended(prefix, now, id, 'x')  -- the jobs that wait for it (deps.lua)
end

-- lease one popped id; returns its job key and token, or nil when the hash is gone (or
-- the job expired)
local function take(id, lane, held)
  popped = popped + 1
  local jk = prefix .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'name', 'payload', 'attempts', 'max_attempts',
    'backoff', 'created_ms', 'timeout_ms', 'trace', 'alone', 'expires_ms')
  if not f[1] then return nil end
  if f[10] and tonumber(f[10]) <= now then
    expire(id, jk, lane)
    return nil
  end
  if not token_base then
    -- tokens never fall behind the server clock in us, so a counter that restarts
    -- (Valkey lost its data, or came back from an older snapshot) still issues
    -- tokens past every one issued before: a stale holder never matches a new claim
    local now_us = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
    token_base = redis.call('INCRBY', KEYS[3], count) - count
    if token_base < now_us then
      token_base = now_us
      redis.call('SET', KEYS[3], string.format('%d', now_us + count))
    end
  end
  local token = string.format('%d', token_base + claimed + 1)
  local attempts = (tonumber(f[3]) or 0) + 1  -- a malformed count reads as none
  local attempts_text = tostring(attempts)  -- converted once for the hash and the event
  if held then
    redis.call('HSET', jk, 'state', 'active', 'attempts', attempts_text, 'token', token,
      'started_ms', now, 'held', held)
  else
    redis.call('HSET', jk, 'state', 'active', 'attempts', attempts_text, 'token', token,
      'started_ms', now)
  end
  event('started', id, lane, attempts_text)
  leased[2 * claimed + 1] = expiry
  leased[2 * claimed + 2] = id
  local n = #out
  out[n + 1] = id
  out[n + 2] = token
  out[n + 3] = f[1]
  out[n + 4] = f[2] or ''
  out[n + 5] = lane
  out[n + 6] = attempts
  out[n + 7] = f[4] or '1'
  out[n + 8] = f[5] or ''
  out[n + 9] = f[6] or '0'
  out[n + 10] = f[7] or ''
  out[n + 11] = f[8] or ''
  out[n + 12] = f[9] or ''
  record[2 * claimed + 1] = id
  record[2 * claimed + 2] = token
  claimed = claimed + 1
  return jk, token
end

local flow = redis.call('EXISTS', KEYS[7], KEYS[8])  -- limits, priorities: 0 when unused
if flow == 0 and redis.call('LLEN', KEYS[1]) == 1 then
  -- one lane on the ring: round-robin has no one to be fair to, so its ids are popped
  -- together (the same jobs, in the same order, as one turn each would take)
  local lane = redis.call('LINDEX', KEYS[1], 0)
  local lk = prefix .. 'lane:' .. lane
  while claimed < count and turns < count * 4 do
    local ids = redis.call('LPOP', lk, count - claimed)
    if not ids then break end
    turns = turns + #ids
    for _, id in ipairs(ids) do take(id, lane) end
  end
  if redis.call('LLEN', lk) == 0 then
    redis.call('LREM', KEYS[1], -1, lane)
  end
  remains = redis.call('LLEN', KEYS[1]) > 0
elseif flow == 0 then
  while claimed < count and turns < count * 4 do
    turns = turns + 1
    local lane = redis.call('LMOVE', KEYS[1], KEYS[1], 'LEFT', 'RIGHT')
    if not lane then break end
    local lk = prefix .. 'lane:' .. lane
    local id = redis.call('LPOP', lk)
    if redis.call('LLEN', lk) == 0 then
      redis.call('LREM', KEYS[1], -1, lane)
    end
    if id then take(id, lane) end
  end
  remains = redis.call('LLEN', KEYS[1]) > 0
else
  local levels = {}
  for _, p in ipairs(redis.call('ZREVRANGE', KEYS[8], 0, -1)) do levels[#levels + 1] = tonumber(p) end
  levels[#levels + 1] = 0
  local function ring_key(p)
    if p == 0 then return KEYS[1] end
    return prefix .. 'ring' .. p
  end
  local function lane_key(p, lane)
    if p == 0 then return prefix .. 'lane:' .. lane end
    return prefix .. 'lane' .. p .. ':' .. lane
  end
  local function parse(text)
    if not text then return {} end
    local max = tonumber(text)
    if max then return { max = max } end  -- "max_active" alone
    local v, i = {}, 0
    for word in string.gmatch(text, '%S+') do
      i = i + 1
      v[i] = tonumber(word)  -- nil for '-', a part not set
    end
    return { max = v[1], rate = v[2], per = v[3] }
  end
  local limited = flow == 2 or #levels == 1  -- no priority levels: the limits hash exists
  local cache = {}
  local default = nil
  local queue_only = false  -- the limits hash holds the queue-wide limit alone
  local function limit_of(lane)
    local l = cache[lane]
    if l == nil then
      l = {}
      if limited and not queue_only then
        local f = redis.call('HMGET', KEYS[7], lane, '*')
        local own = parse(f[1])
        if default == nil then default = parse(f[2]) end
        l.max = own.max or default.max
        if own.rate then l.rate, l.per = own.rate, own.per
        elseif default.rate then l.rate, l.per = default.rate, default.per end
      end
      cache[lane] = l
    end
    return l
  end
  local wake_at = nil  -- the earliest rate window this claim closed
  -- nil when the lane may start a job now (counting it in the active hash when it has a
  -- max_active: the caller gives the count back if nothing is claimed); 0 when it is at
  -- its max_active; else the time (ms) its rate window opens
  local function closed_until(lane, l)
    if l.rate then
      local w = redis.call('ZSCORE', KEYS[11], lane)
      if w then return tonumber(w) end  -- promote opens it (and every level's entry)
      local sk = prefix .. 'starts:' .. lane
      redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - l.per)
      if redis.call('ZCARD', sk) >= l.rate then
        local oldest = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
        local at = tonumber(oldest[2]) + l.per
        redis.call('ZADD', KEYS[11], at, lane)
        if wake_at == nil or at < wake_at then wake_at = at end
        return at
      end
    end
    if l.max then
      local c = redis.call('HINCRBY', KEYS[9], lane, 1)
      if c % 1000000000 > l.max then
        -- give the count back and flag the lane as blocked (once), so the settle that
        -- frees a slot knows from its own HINCRBY that the lane must go back
        redis.call('HINCRBY', KEYS[9], lane, c >= 1000000000 and -1 or 999999999)
        return 0
      end
    end
    return nil
  end
  -- the queue-wide limit (limits field "@queue", set_queue_limit): it and the lanes' both
  -- hold. Active jobs are the leases; a claim cut short by max_active leaves "qfull", so
  -- the settle that frees a slot rings; a full rate window puts "@queue" in the lane wake
  -- zset and "0|@queue" in the blocked set, so promote rings when the window opens (it
  -- pushes "@queue" on the ring, which a claim drops)
  local qrate = nil
  if limited then
    local qtext = redis.call('HGET', KEYS[7], '@queue')
    local ql = parse(qtext)
    queue_only = qtext ~= false and redis.call('HLEN', KEYS[7]) == 1
    local room = nil
    if ql.max then
      room = ql.max - redis.call('ZCARD', KEYS[2])
      if room < count then redis.call('SET', prefix .. 'qfull', '1') end
    end
    if ql.rate then
      qrate = ql
      local sk = prefix .. 'starts:@queue'
      redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - ql.per)
      local left = ql.rate - redis.call('ZCARD', sk)
      -- a window already recorded was rung for when it was (promote opens it): ringing
      -- again at each claim would wake a parked consumer whose claim rings again
      if left <= 0 and not redis.call('ZSCORE', KEYS[11], '@queue') then
        local oldest = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
        local at = tonumber(oldest[2]) + ql.per
        redis.call('ZADD', KEYS[11], at, '@queue')
        redis.call('SADD', KEYS[10], '0|@queue')
        wake_at = at
      end
      if room == nil or left < room then room = left end
    end
    if room and room < count then count = math.max(room, 0) end
  end
  local li = 1
  local skips = 0  -- lanes taken off at a limit: not turns, each leaves its ring
  while claimed < count and turns < count * 4 and skips < 1000 and levels[li] do
    local p = levels[li]
    local rk = ring_key(p)
    local lane = redis.call('LMOVE', rk, rk, 'LEFT', 'RIGHT')
    if not lane then
      if p > 0 and redis.call('SCARD', KEYS[10]) == 0 then redis.call('ZREM', KEYS[8], p) end
      li = li + 1
    elseif lane == '@queue' then
      redis.call('LREM', rk, -1, lane)  -- pushed by promote as the queue's window opened
    else
      turns = turns + 1
      local l = limit_of(lane)
      local at = nil
      if l.max or l.rate then at = closed_until(lane, l) end
      if at then
        turns = turns - 1
        skips = skips + 1
        redis.call('LREM', rk, -1, lane)
        redis.call('SADD', KEYS[10], p .. '|' .. lane)
      else
        local lk = lane_key(p, lane)
        local id = redis.call('LPOP', lk)
        if redis.call('LLEN', lk) == 0 then
          redis.call('LREM', rk, -1, lane)
        end
        local jk, token = nil, nil
        if id then jk, token = take(id, lane, limited and (l.max and '1' or '0') or nil) end
        if not jk then
          if l.max and redis.call('HINCRBY', KEYS[9], lane, -1) <= 0 then
            redis.call('HDEL', KEYS[9], lane)
          end
        elseif l.rate then
          local sk = prefix .. 'starts:' .. lane
          redis.call('ZADD', sk, now, token)
          redis.call('PEXPIRE', sk, l.per)
        end
      end
    end
  end
  skipped_out = skips >= 1000
  if qrate and claimed > 0 then
    local sk = prefix .. 'starts:@queue'
    for i = 2, #record, 2 do redis.call('ZADD', sk, now, record[i]) end
    redis.call('PEXPIRE', sk, qrate.per)
  end
  for i = li, #levels do
    if redis.call('LLEN', ring_key(levels[i])) > 0 then
      remains = true
      break
    end
  end
  -- a window that opens before anything the metronome waits for: make it look again
  if wake_at then
    local head = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
    local due = redis.call('ZRANGE', KEYS[12], 0, 0, 'WITHSCORES')
    if tonumber(head[2]) >= wake_at and (not due[2] or tonumber(due[2]) > wake_at) then
      if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
        redis.call('ZADD', ARGV[1] .. 'marker', 'LT', wake_at, '1')
      else
        if redis.call('LPUSH', KEYS[4], '1') > 64 then redis.call('LTRIM', KEYS[4], 0, 63) end
      end
    end
  end
end
sliced('ZADD', KEYS[2], leased)
if popped > 0 then redis.call('HINCRBY', KEYS[5], 'waiting', -popped) end
if claimed > 0 and ARGV[5] and ARGV[5] ~= '' then
  local ck = prefix .. 'claims:' .. ARGV[5]
  sliced('RPUSH', ck, record)
  redis.call('LTRIM', ck, -2 * tonumber(ARGV[6]), -1)
  redis.call('PEXPIRE', ck, 10 * tonumber(ARGV[2]))
end
-- a claim that stopped at its cap of skipped lanes rings whatever it claimed, so the
-- next claim goes on through the ring
if (ARGV[4] == '1' and claimed > 0 or skipped_out) and remains then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[4], '1') > 64 then redis.call('LTRIM', KEYS[4], 0, 63) end
  end
end
deps_flush(prefix)
flush_events(KEYS[13])  -- events
return out
