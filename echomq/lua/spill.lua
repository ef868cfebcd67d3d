--[[
  spill: leave far-future jobs on the floor alone, with a stub in Valkey.

  A spilled job keeps a stub hash: the few small fields a reader shows (id,
  name, lane, state "scheduled", attempts, max_attempts, due_ms, priority,
  created_ms, a result waiter's "waited" mark) and "spilled" 1, which says its
  other fields (payload, error, ...) are on the floor. The stub keeps the job visible to
  get, result and jobs on any client, and its id taken (admit and schedule
  refuse it); the spilled set counts the spilled jobs and is what a restore
  checks. Nothing claims a stub: it is on no lane, in no lease or schedule set.
  Job hashes are built inside.

  Mode "schedule" (the scheduler's spill): a job leaves only if it is still
  scheduled at the due time the floor recorded (it was not promoted, retried
  or re-added meanwhile); it leaves the schedule set and its hash becomes the
  stub.
  Mode "rows" (a rehydration after Valkey lost its data, for rows that stay
  spilled): a job with no hash gets a stub built from its floor row's fields
  and joins the spilled set; a job with a hash (a stub already, or a job added
  under the same id since the loss) is left alone, and so is one whose id is
  among the tombstones or the graves (records.lua: it ended, cancelled while
  spilled, and purge dropped it before the beat closed its row).

  Input:
    KEYS[1] schedule  zset of deferred job ids by due time (ms)
    KEYS[2] spilled   set of ids held by the floor alone
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] mode: "schedule" or "rows"
    ARGV[3..] mode "schedule": pairs id, due_ms as written to the floor;
              mode "rows": per job id, due_ms, field count n, then n field/value pairs

  Output:
    an array with one integer per job: 1 spilled (a stub written), 0 left as it was
]]
local kept = { 'id', 'name', 'lane', 'attempts', 'max_attempts', 'priority', 'created_ms',
  'waited' }
local function stub(jk, id, due_ms, fields)
  local args = { 'id', id, 'state', 'scheduled', 'due_ms', due_ms, 'spilled', 1,
    'name', fields['name'] or '(unknown)', 'lane', fields['lane'] or 'default' }
  for _, field in ipairs(kept) do
    if fields[field] and field ~= 'id' and field ~= 'name' and field ~= 'lane' then
      args[#args + 1] = field
      args[#args + 1] = fields[field]
    end
  end
  redis.call('DEL', jk)
  redis.call('HSET', jk, unpack(args))
end

--!include records
local out = {}
local prefix = ARGV[1]
if ARGV[2] == 'schedule' then
  for i = 3, #ARGV, 2 do
    local id = ARGV[i]
    local jk = prefix .. 'job:' .. id
    local score = redis.call('ZSCORE', KEYS[1], id)
    -- the floor's due_ms is the score rounded up to the ms (schedule.lua)
    if score and math.ceil(tonumber(score)) == tonumber(ARGV[i + 1])
        and redis.call('HGET', jk, 'state') == 'scheduled' then
      local values = redis.call('HMGET', jk, unpack(kept))
      local by_name = {}
      for k, field in ipairs(kept) do by_name[field] = values[k] end
      redis.call('ZREM', KEYS[1], id)
      stub(jk, id, ARGV[i + 1], by_name)
      redis.call('SADD', KEYS[2], id)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  end
else
  local i = 3
  while i <= #ARGV do
    local id = ARGV[i]
    local n = tonumber(ARGV[i + 2])
    local jk = prefix .. 'job:' .. id
    if redis.call('EXISTS', jk) == 0 and not record_gone(prefix, id) then
      local by_name = {}
      for f = 0, n - 1 do by_name[ARGV[i + 3 + f * 2]] = ARGV[i + 4 + f * 2] end
      stub(jk, id, ARGV[i + 1], by_name)
      redis.call('SADD', KEYS[2], id)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
    i = i + 3 + n * 2
  end
end
return out
