--[[
  survey: the lanes with the most waiting jobs and the oldest waiting job (read-only).

  Looks at up to `scan` lanes of the ring (LLEN each, only when `top` > 0) and
  at the head job of the first `heads` of them (its created_ms), so its cost is
  bounded however many lanes exist; `scanned` and `lanes` tell whether it saw
  them all. Lane
  lists and job hashes are built inside.

  Input:
    KEYS[1] ring  list of lanes with waiting jobs
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] scan, the most lanes to look at
    ARGV[3] top, how many of the longest lanes to return
    ARGV[4] heads, how many lanes' head jobs to look at for the oldest

  Output:
    { lanes on the ring, lanes scanned, oldest head created_ms or -1, server now ms,
      then lane, length pairs, longest first }
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local top = tonumber(ARGV[3])
local heads = tonumber(ARGV[4])
local lanes = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local best = {}  -- the `top` longest so far, longest first (top is small: insertion)
local oldest = -1
for i, lane in ipairs(lanes) do
  local lk = prefix .. 'lane:' .. lane
  local len = top > 0 and redis.call('LLEN', lk) or 0
  if top > 0 and (#best < top or len > best[#best][2]) then
    local pos = #best + 1
    while pos > 1 and best[pos - 1][2] < len do pos = pos - 1 end
    table.insert(best, pos, { lane, len })
    if #best > top then best[#best] = nil end
  end
  if i <= heads then
    local head = redis.call('LINDEX', lk, 0)
    if head then
      local created = tonumber(redis.call('HGET', prefix .. 'job:' .. head, 'created_ms') or '-1')
      if created >= 0 and (oldest < 0 or created < oldest) then oldest = created end
    end
  end
end
local out = { redis.call('LLEN', KEYS[1]), #lanes, oldest, now }
for _, pair in ipairs(best) do
  local n = #out
  out[n + 1] = pair[1]
  out[n + 2] = pair[2]
end
return out
