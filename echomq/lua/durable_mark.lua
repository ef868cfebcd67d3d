--[[
  durable_mark: under the "durable" dial, mark just-admitted jobs as held by the floor
  and read them for their floor rows.

  A job still scheduled, waiting, active or blocked (and not a spilled job's stub) gets field
  "deferred" 1: settle, cancel and reap then append it to the closed log when it
  finishes (while the queue folds), so the scheduler closes its floor row within a
  beat. A job that already finished is left alone and returns an empty array (it
  needs no row), and so does one whose hash is gone but whose id is still reserved by
  its dedup_ms (key "dedup:<id>": it finished, and this admit was refused); one whose
  hash is gone otherwise returns 0 (Valkey may have lost its data since the admit: the
  producer writes the row from what it admitted). Job hashes are built
  inside.

  Input:
    KEYS[1] meta      queue settings hash (routes the call to the queue's node)
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] job ids

  Output:
    an array with one entry per id: the job's hash as a flat field/value array,
    an empty array when the job finished, 0 when its hash is gone
]]
local prefix = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local jk = prefix .. 'job:' .. ARGV[i]
  local f = redis.call('HMGET', jk, 'state', 'spilled')
  if (f[1] == 'waiting' or f[1] == 'active' or f[1] == 'scheduled' or f[1] == 'blocked')
    and f[2] ~= '1' then
    redis.call('HSET', jk, 'deferred', 1)
    out[#out + 1] = redis.call('HGETALL', jk)
  elseif not f[1] and redis.call('EXISTS', prefix .. 'dedup:' .. ARGV[i]) == 0 then
    out[#out + 1] = 0
  else
    out[#out + 1] = {}
  end
end
return out
