--[[
  spill: drop far-future jobs from Valkey once the floor holds them.

  A job leaves only if it is still scheduled at the due time the floor
  recorded (it was not promoted, retried or re-added meanwhile). Its hash and
  schedule entry are removed and the queue's spilled count goes up. Job
  hashes are built inside.

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] meta      queue settings hash (field "spilled")
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2..] pairs: id, due_ms as written to the floor

  Output:
    an array with one integer per pair: 1 spilled, 0 left in Valkey
]]
local out = {}
local spilled = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local jk = ARGV[1] .. 'job:' .. id
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == tonumber(ARGV[i + 1])
      and redis.call('HGET', jk, 'state') == 'scheduled' then
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', jk)
    spilled = spilled + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if spilled > 0 then redis.call('HINCRBY', KEYS[2], 'spilled', spilled) end
return out
