--[[
  survey: the lanes with the most waiting jobs and the oldest waiting job (read-only).

  Looks at up to `scan` lanes of the ring (LLEN and the head's created_ms for
  each), so its cost is bounded however many lanes exist; `scanned` and
  `lanes` tell whether it saw them all. Lane lists and job hashes are built
  inside.

  Input:
    KEYS[1] ring  list of lanes with waiting jobs
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] scan, the most lanes to look at
    ARGV[3] top, how many of the longest lanes to return

  Output:
    { lanes on the ring, lanes scanned, oldest head created_ms or -1, server now ms,
      then lane, length pairs, longest first }
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local top = tonumber(ARGV[3])
local lanes = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local sized = {}
local oldest = -1
for _, lane in ipairs(lanes) do
  local lk = prefix .. 'lane:' .. lane
  sized[#sized + 1] = { lane, redis.call('LLEN', lk) }
  local head = redis.call('LINDEX', lk, 0)
  if head then
    local created = tonumber(redis.call('HGET', prefix .. 'job:' .. head, 'created_ms') or '-1')
    if created >= 0 and (oldest < 0 or created < oldest) then oldest = created end
  end
end
table.sort(sized, function(a, b) return a[2] > b[2] end)
local out = { redis.call('LLEN', KEYS[1]), #lanes, oldest, now }
for i = 1, math.min(top, #sized) do
  local n = #out
  out[n + 1] = sized[i][1]
  out[n + 2] = sized[i][2]
end
return out
