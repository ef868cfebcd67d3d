--[[
  cron_fire: admit occurrences of one cron, each exactly once.

  An occurrence is admitted only when it is later than the cron's last one, and
  the last one moves to it in the same call: a second call with the same due
  time (a new leader, a retried call) admits nothing. The job id is
  "cron:<key>:<due_ms>"; the job hash, lane push, ring and stats are written as
  admit.lua writes them (keep the two in step). The job hash and lane list are
  built inside from the prefix and the cron's lane.

  Input:
    KEYS[1] crons     hash: cron key -> spec (JSON: name, payload, lane, rev, max_attempts,
                      max_stalls)
    KEYS[2] cronlast  hash: cron key -> due time (ms) of the last occurrence admitted
    KEYS[3] ring      list of lanes with waiting jobs
    KEYS[4] wake      the doorbell list
    KEYS[5] spilled   set of ids held by the floor alone
    KEYS[6] stats     counters (field "waiting": ids on the lanes)
    KEYS[7] paused    string, present while the queue is paused
    KEYS[8] events    capped stream of job events
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] cron key
    ARGV[3] the spec's rev the caller computed the due times from
    ARGV[4..] due times (ms), earliest first

  Output:
    { admitted (count), the cron's last (ms) }, or { -1, 0 } when the cron is gone or was
    replaced (another rev)
]]
--!include events
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix, key = ARGV[1], ARGV[2]
local raw = redis.call('HGET', KEYS[1], key)
if not raw then return { -1, 0 } end
local ok, spec = pcall(cjson.decode, raw)
if not ok or type(spec) ~= 'table' or spec['rev'] ~= ARGV[3] then return { -1, 0 } end
local lastText = redis.call('HGET', KEYS[2], key) or '0'
local last = tonumber(lastText) or 0
local admitted = 0
for i = 4, #ARGV do
  local due = tonumber(ARGV[i])
  if due and due > last then
    last, lastText = due, ARGV[i]
    local id = 'cron:' .. key .. ':' .. ARGV[i]
    local jk = prefix .. 'job:' .. id
    if redis.call('EXISTS', jk, prefix .. 'dedup:' .. id) == 0
        and redis.call('SISMEMBER', KEYS[5], id) == 0 then
      local lane = spec['lane']
      redis.call('HSET', jk, 'id', id, 'name', spec['name'], 'payload', spec['payload'],
        'lane', lane, 'state', 'waiting', 'max_attempts', spec['max_attempts'],
        'max_stalls', spec['max_stalls'], 'created_ms', now)  -- attempts, stalls: 0 unstored
      if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
        redis.call('RPUSH', KEYS[3], lane)
      end
      admitted = admitted + 1
      event('added', id, lane)
    end
  end
end
redis.call('HSET', KEYS[2], key, lastText)
if admitted > 0 then
  redis.call('HINCRBY', KEYS[6], 'waiting', admitted)
  if redis.call('EXISTS', KEYS[7]) == 0 then
    if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
      redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
    else
      if redis.call('LPUSH', KEYS[4], '1') > 64 then redis.call('LTRIM', KEYS[4], 0, 63) end
    end
  end
end
flush_events(KEYS[8])  -- events
return { admitted, lastText }
