--[[
  jobs: one page of the jobs in a state, with a cursor (read-only).

  Costs O(limit), however many jobs the state holds. "waiting" walks the ring
  and reads each lane from the cursor on (cursor "<ring index>:<offset in
  lane>"); the other states read their zset by rank (cursor "<rank>"), oldest
  first. Claims rotate the ring, so a waiting listing is a snapshot of one
  moment per page, not a frozen order. Lane lists and job hashes are built
  inside; ids whose hash is gone are skipped.

  Input:
    KEYS[1] ring    list of lanes with waiting jobs
    KEYS[2] source  the state's zset (schedule, leases, completed, dead or cancelled);
                    ignored for "waiting"
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
  local sep = string.find(ARGV[3], ':', 1, true)
  local lane_i, offset = 0, 0
  if sep then
    lane_i = tonumber(string.sub(ARGV[3], 1, sep - 1))
    offset = tonumber(string.sub(ARGV[3], sep + 1))
  end
  local lanes = redis.call('LRANGE', KEYS[1], lane_i, lane_i + limit - 1)
  for i, lane in ipairs(lanes) do
    local want = limit - #ids
    local got = redis.call('LRANGE', prefix .. 'lane:' .. lane, offset, offset + want - 1)
    for _, id in ipairs(got) do ids[#ids + 1] = id end
    if #ids >= limit then
      next_cursor = (lane_i + i - 1) .. ':' .. (offset + #got)
      break
    end
    offset = 0
  end
  if next_cursor == '' and #lanes == limit then next_cursor = (lane_i + limit) .. ':0' end
else
  local start = tonumber(ARGV[3]) or 0
  ids = redis.call('ZRANGE', KEYS[2], start, start + limit - 1)
  if #ids == limit then next_cursor = tostring(start + limit) end
end
local out = { next_cursor }
for _, id in ipairs(ids) do
  local h = redis.call('HGETALL', prefix .. 'job:' .. id)
  if #h > 0 then out[#out + 1] = h end
end
return out
