--[[
  admit: write jobs that are claimable now and push each onto its lane.

  Idempotent per job id: an id whose hash already exists is left unchanged.
  A lane that goes from empty to non-empty joins the ring. Rings the doorbell
  once when anything was admitted.

  Input:
    KEYS[1] ring   list of lanes with waiting jobs
    KEYS[2] wake   the doorbell list
    ARGV[1] key prefix "emq:{q}:"  (job hashes and lane lists are built from it)
    ARGV[2] n, the number of jobs
    ARGV[3..] per job, 8 values: id, name, payload, lane, max_attempts, max_stalls, backoff,
              timeout_ms ('' for none)

  Output:
    an array of n integers: 1 admitted, 0 already existed
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local n = tonumber(ARGV[2])
local out = {}
local admitted = false
for i = 0, n - 1 do
  local b = 3 + i * 8
  local id = ARGV[b]
  local jk = prefix .. 'job:' .. id
  if redis.call('EXISTS', jk) == 1 then
    out[i + 1] = 0
  else
    local lane = ARGV[b + 3]
    redis.call('HSET', jk, 'id', id, 'name', ARGV[b + 1], 'payload', ARGV[b + 2],
      'lane', lane, 'state', 'waiting', 'attempts', 0, 'max_attempts', ARGV[b + 4],
      'stalls', 0, 'max_stalls', ARGV[b + 5], 'backoff', ARGV[b + 6], 'created_ms', now)
    if ARGV[b + 7] ~= '' then redis.call('HSET', jk, 'timeout_ms', ARGV[b + 7]) end
    if redis.call('RPUSH', prefix .. 'lane:' .. lane, id) == 1 then
      redis.call('RPUSH', KEYS[1], lane)
    end
    out[i + 1] = 1
    admitted = true
  end
end
if admitted then
  redis.call('LPUSH', KEYS[2], '1')
  redis.call('LTRIM', KEYS[2], 0, 63)
end
return out
