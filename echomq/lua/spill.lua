--[[
  spill: drop far-future jobs from Valkey once the floor holds them.

  A job leaves only if it is still scheduled at the due time the floor
  recorded (it was not promoted, retried or re-added meanwhile). Its hash and
  schedule entry are removed and its id joins the spilled set, which keeps the
  id taken (admit and schedule refuse it) and counts the spilled jobs. Job
  hashes are built inside.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] spilled   set of ids held by the floor alone
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] pairs: id, due_ms as written to the floor

  Output:
    an array with one integer per pair: 1 spilled, 0 left in Valkey
]]
local out = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local jk = ARGV[1] .. 'job:' .. id
  local score = redis.call('ZSCORE', KEYS[1], id)
  -- the floor's due_ms is the score rounded up to the ms (schedule.lua)
  if score and math.ceil(tonumber(score)) == tonumber(ARGV[i + 1])
      and redis.call('HGET', jk, 'state') == 'scheduled' then
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', jk)
    redis.call('SADD', KEYS[2], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
