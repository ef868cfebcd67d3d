--[[
  claim (Lanes.claim): lease up to `count` waiting jobs, one lane per turn.

  Each turn rotates the ring (LMOVE head to tail) and pops the oldest id of
  that lane, so a lane with 10,000 jobs and a lane with 1 alternate. A lane
  left empty leaves the ring. Each claimed job gets attempts + 1, a fresh
  lease token and a lease in the leases zset, expiring lease_ms from the
  server's clock. Ids whose hash is missing are dropped. A job marked to run
  alone (released as a suspect of a process crash, see reap.lua) says so in
  its reply, and the mark goes: a crash during that lone run is its own. With the chain
  flag, the doorbell rings when lanes still hold work after the claim, so a
  burst admitted with one ring wakes parked consumers one after another
  instead of one consumer taking it all. A paused queue (the pause flag
  exists) hands out nothing. The lane list and the job hash are built from
  the prefix inside the script. With a claimer name, the ids and tokens
  handed out are also appended to "<prefix>claims:<claimer>" (the newest
  `keep` pairs kept, expiring ten leases after the last claim, so that it
  outlives an outage that outlived the leases): a supervisor whose consumer
  died before it could record a claim's reply hands those jobs back at once,
  uncharged, instead of waiting for their leases to expire.

  Input:
    KEYS[1] ring    list of lanes with waiting jobs
    KEYS[2] leases  zset of active job ids by lease expiry (ms)
    KEYS[3] tokens  lease token counter (kept at or past the server clock in us)
    KEYS[4] wake    the doorbell list
    KEYS[5] stats   counters (field "waiting": ids on the lanes)
    KEYS[6] paused  string, present while the queue is paused
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
if redis.call('EXISTS', KEYS[6]) == 1 then return {} end
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
local popped = 0
while claimed < count and turns < count * 4 do
  turns = turns + 1
  local lane = redis.call('LMOVE', KEYS[1], KEYS[1], 'LEFT', 'RIGHT')
  if not lane then break end
  local lk = prefix .. 'lane:' .. lane
  local id = redis.call('LPOP', lk)
  if redis.call('LLEN', lk) == 0 then
    redis.call('LREM', KEYS[1], -1, lane)
  end
  if id then
    popped = popped + 1
    local jk = prefix .. 'job:' .. id
    local f = redis.call('HMGET', jk, 'name', 'payload', 'attempts', 'max_attempts',
      'backoff', 'created_ms', 'timeout_ms', 'trace', 'alone')
    if f[1] then
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
      redis.call('HSET', jk, 'state', 'active', 'attempts', attempts, 'token', token,
        'started_ms', now)
      redis.call('ZADD', KEYS[2], expiry, id)
      if f[9] then redis.call('HDEL', jk, 'alone') end
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
    end
  end
end
if popped > 0 then redis.call('HINCRBY', KEYS[5], 'waiting', -popped) end
if claimed > 0 and ARGV[5] and ARGV[5] ~= '' then
  local ck = prefix .. 'claims:' .. ARGV[5]
  redis.call('RPUSH', ck, unpack(record))
  redis.call('LTRIM', ck, -2 * tonumber(ARGV[6]), -1)
  redis.call('PEXPIRE', ck, 10 * tonumber(ARGV[2]))
end
if ARGV[4] == '1' and claimed > 0 and redis.call('LLEN', KEYS[1]) > 0 then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    redis.call('LPUSH', KEYS[4], '1')
    redis.call('LTRIM', KEYS[4], 0, 63)
  end
end
return out
