--[[
  jobs: one page of the jobs in a state, with a cursor (read-only).

  Costs O(limit), however many jobs the state holds. "waiting" walks the ring
  and reads each lane from the cursor on (cursor "<ring index>:<offset in
  lane>"); with flow control it first walks the rings of priorities above 0,
  highest first ("ring<p>", lanes "lane<p>:<lane>", built inside; cursor
  "<p>:<ring index>:<offset>"), and last the lanes a limit took off their rings
  (the blocked set, sorted: cursor "10:<index>:<offset>", a page costing
  O(blocked) more). The other states read their zset by rank (cursor "<rank>"), oldest
  first; "scheduled" then goes on with the jobs spilled to the floor (their
  stubs, spill.lua), which are due after every job of the schedule set, in the
  spilled set's SSCAN order (cursor "<sscan cursor>:<ids of that batch already
  listed>"; a set changed between pages may list an id twice or skip one added
  meanwhile, as SSCAN does). Claims rotate the ring, so a waiting listing is a snapshot of one
  moment per page, not a frozen order. Lane lists and job hashes are built
  inside; ids whose hash is gone are skipped.

  Input:
    KEYS[1] ring    list of lanes with waiting jobs
    KEYS[2] source  the state's zset (schedule, leases, completed, dead or cancelled);
                    ignored for "waiting"
    KEYS[3] prios   zset of priority levels above 0 in use
    KEYS[4] blocked set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[5] spilled set of ids held by the floor alone (read for "scheduled")
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] state
    ARGV[3] cursor ("" or "0" to start)
    ARGV[4] limit

  Output:
    { next cursor or "" at the end, then per job: its HGETALL array }
]]
local prefix = ARGV[1]
local limit = tonumber(ARGV[4])
local ids = {}
local next_cursor = ''
if ARGV[2] == 'waiting' then
  -- sources in claim order: the rings of priorities above 0 (highest first), the plain
  -- ring (0), then lanes a limit took off their rings (10: the blocked set, sorted)
  local seq = {}
  local levels = redis.call('ZRANGE', KEYS[3], 0, -1)
  for j = #levels, 1, -1 do seq[#seq + 1] = tonumber(levels[j]) end
  seq[#seq + 1] = 0
  if redis.call('SCARD', KEYS[4]) > 0 then seq[#seq + 1] = 10 end
  local function rank(p)
    if p == 10 then return 11 elseif p == 0 then return 10 end
    return 10 - p
  end
  local parts = {}
  for word in string.gmatch(ARGV[3], '[^:]+') do parts[#parts + 1] = tonumber(word) end
  local from, lane_i, offset = seq[1], 0, 0
  if #parts == 2 then from, lane_i, offset = 0, parts[1], parts[2]
  elseif #parts == 3 then from, lane_i, offset = parts[1], parts[2], parts[3] end
  local k = 1
  while seq[k] and rank(seq[k]) < rank(from) do k = k + 1 end
  if seq[k] ~= from then lane_i, offset = 0, 0 end
  local function cursor(p, i, o)
    if p == 0 then return i .. ':' .. o end
    return p .. ':' .. i .. ':' .. o
  end
  local scanned = 0  -- lanes looked at: a page costs O(limit)
  while seq[k] and next_cursor == '' and scanned < limit do
    local p = seq[k]
    local lanes = {}
    local budget = limit - scanned
    if p == 10 then
      local entries = redis.call('SMEMBERS', KEYS[4])
      table.sort(entries)
      for j = lane_i + 1, math.min(#entries, lane_i + budget) do
        local bar = string.find(entries[j], '|', 1, true)
        local q = string.sub(entries[j], 1, bar - 1)
        local lane = string.sub(entries[j], bar + 1)
        lanes[#lanes + 1] = q == '0' and prefix .. 'lane:' .. lane
          or prefix .. 'lane' .. q .. ':' .. lane
      end
    else
      local rk = p == 0 and KEYS[1] or prefix .. 'ring' .. p
      for _, lane in ipairs(redis.call('LRANGE', rk, lane_i, lane_i + budget - 1)) do
        lanes[#lanes + 1] = p == 0 and prefix .. 'lane:' .. lane
          or prefix .. 'lane' .. p .. ':' .. lane
      end
    end
    for i, lk in ipairs(lanes) do
      local want = limit - #ids
      local got = redis.call('LRANGE', lk, offset, offset + want - 1)
      for _, id in ipairs(got) do ids[#ids + 1] = id end
      if #ids >= limit then
        next_cursor = cursor(p, lane_i + i - 1, offset + #got)
        break
      end
      offset = 0
    end
    scanned = scanned + #lanes
    if next_cursor == '' then
      if #lanes == budget then
        next_cursor = cursor(p, lane_i + budget, 0)
      else
        k = k + 1
        lane_i, offset = 0, 0
        if seq[k] and scanned >= limit then next_cursor = cursor(seq[k], 0, 0) end
      end
    end
  end
else
  local scan, skip = nil, 0
  local colon = string.find(ARGV[3], ':', 1, true)
  if colon then
    scan, skip = string.sub(ARGV[3], 1, colon - 1), tonumber(string.sub(ARGV[3], colon + 1))
  else
    local start = tonumber(ARGV[3]) or 0
    ids = redis.call('ZRANGE', KEYS[2], start, start + limit - 1)
    if #ids == limit then next_cursor = tostring(start + limit) end
    if #ids < limit and ARGV[2] == 'scheduled' then scan = '0' end
  end
  -- the spilled jobs, after the schedule set; a bounded number of SSCAN calls a page
  if scan and redis.call('SCARD', KEYS[5]) > 0 then
    for _ = 1, 10 do
      local reply = redis.call('SSCAN', KEYS[5], scan, 'COUNT', limit - #ids + skip)
      local batch = reply[2]
      local take = math.min(#batch - skip, limit - #ids)
      for j = skip + 1, skip + take do ids[#ids + 1] = batch[j] end
      if skip + take < #batch then
        next_cursor = scan .. ':' .. (skip + take)
        break
      end
      skip = 0
      scan = reply[1]
      if scan == '0' then break end
      if #ids >= limit then
        next_cursor = scan .. ':0'
        break
      end
    end
    if next_cursor == '' and scan ~= '0' then next_cursor = scan .. ':0' end
  end
end
local out = { next_cursor }
for _, id in ipairs(ids) do
  local h = redis.call('HGETALL', prefix .. 'job:' .. id)
  if #h > 0 then out[#out + 1] = h end
end
return out
