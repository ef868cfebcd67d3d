--[[
  lead: take or renew the scheduler's leader lease and report what needs doing.

  One scheduler per queue across all replicas holds the lease. Its fencing
  token is the server time (ms) when it took the lease, so a later leader
  always has a larger token, even after Valkey lost its data. The floor
  refuses writes with a token smaller than one it has seen.

  The leader also renews the fold lease (meta field "fold": until when, in
  server ms, scripts append to the fold and closed logs). When no scheduler
  runs, the lease runs out and the logs stop growing; the next leader learns
  that it lapsed and sweeps the schedule set onto the floor instead. The sweep
  takes many calls; meta "sweep" names the fence of the leader that owes it
  (set here when a lapse is noticed, by the scheduler when it drops its logs),
  so a leader that finds a sweep owed by another fence (the one that owed it
  left mid-way, within the fold lease) sweeps again; the owner's call after its
  sweep ended (ARGV[5] "1") clears it. A
  scheduler without a floor (it only admits crons) passes a fold lease of 0
  and leaves the fold lease alone; while it leads, meta "cronly" names it, and
  a scheduler with a floor takes the lease from it at once (a larger fence), so
  folding, restoring and rehydrating never wait behind a floor-less replica.

  The leader stamps meta "led" with the server time of each renewal; the call
  returns the stamp it replaced, so a new leader knows whether a scheduler ran
  moments ago (a hand-over) or not for a while (occurrences missed meanwhile are
  admitted once, not once per missed tick). Meta "crons" is the crons' version,
  meta "limits" the lane limits' version (limit.lua).

  Input:
    KEYS[1] leader    string "<replica>|<fence>", with a TTL
    KEYS[2] fold      list of ids to write to the floor
    KEYS[3] closed    list of ids whose floor rows to close
    KEYS[4] epoch     set by the scheduler; gone means Valkey lost its data
    KEYS[5] schedule  zset of deferred job ids by due time (ms)
    KEYS[6] meta      queue settings hash (fields "fold", "led", "crons", "cronly", "limits",
                      "sweep")
    ARGV[1] replica id
    ARGV[2] lease ttl in ms
    ARGV[3] spill threshold offset in ms (jobs due after now + this are spill candidates)
    ARGV[4] fold lease in ms (0: leave the fold lease alone)
    ARGV[5] "1" when the caller's sweep ended since its last call (else "")

  Output:
    { fence or -1 when another replica leads, fold length, closed length,
      epoch or "", spill candidates, server now in ms,
      1 when the fold lease had lapsed before this call, 2 when a sweep is owed by
      another fence, else 0 (either: sweep from the start),
      the previous "led" stamp or "" (a leader only; else ""), the crons' version or "",
      the lane limits' version or "" }
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local me = ARGV[1]
local floored = tonumber(ARGV[4]) > 0
local held = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[6], 'fold', 'led', 'crons', 'cronly', 'limits', 'sweep')
local fence = -1
if held then
  local sep = string.find(held, '|', 1, true)
  local holder = string.sub(held, 1, sep - 1)
  if holder == me then
    fence = tonumber(string.sub(held, sep + 1))
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  elseif floored and meta[4] == holder then
    -- the holder schedules crons alone: a scheduler with a floor takes over
    fence = math.max(now, (tonumber(string.sub(held, sep + 1)) or 0) + 1)
    redis.call('SET', KEYS[1], me .. '|' .. fence, 'PX', ARGV[2])
  end
else
  fence = now
  redis.call('SET', KEYS[1], me .. '|' .. fence, 'PX', ARGV[2])
end
local lapsed = 0
local led = ''
if fence >= 0 then
  led = meta[2] or ''
  if floored then
    local mine = tostring(fence)
    local owed = meta[6]
    if owed == mine and ARGV[5] == '1' then
      redis.call('HDEL', KEYS[6], 'sweep')
      owed = nil
    end
    if (tonumber(meta[1] or '') or 0) < now then
      lapsed = 1
    elseif owed and owed ~= mine then
      lapsed = 2
    end
    if lapsed > 0 then redis.call('HSET', KEYS[6], 'sweep', mine) end
    redis.call('HSET', KEYS[6], 'fold', now + tonumber(ARGV[4]), 'led', now)
    if meta[4] then redis.call('HDEL', KEYS[6], 'cronly') end
  else
    redis.call('HSET', KEYS[6], 'led', now)
    if meta[4] ~= me then redis.call('HSET', KEYS[6], 'cronly', me) end
  end
end
local epoch = redis.call('GET', KEYS[4]) or ''
local spill = redis.call('ZCOUNT', KEYS[5], '(' .. (now + tonumber(ARGV[3])), '+inf')
return { fence, redis.call('LLEN', KEYS[2]), redis.call('LLEN', KEYS[3]), epoch, spill, now,
  lapsed, led, meta[3] or '', meta[5] or '' }
