--[[
  limit: set or clear one lane's flow limits (or the queue default, lane "*").

  The value is "max_active rate per_ms", "-" for a part not set, or
  "max_active" alone; an empty
  value clears the entry (the lane falls back to the default; the limits hash
  gone means claims take the plain path again). The lane (for "*": every lane)
  is then put back on every ring a claim took it off (blocked set
  "<p>|<lane>", rings "ring<p>" of levels above 0 built inside), leaves the
  lane wake zset and loses its blocked flag in the active count, and the doorbell rings when anything came back: the next
  claim judges it by the new limits. Bumps the meta field "limits", which the
  scheduler's lead call returns, so a scheduler with a floor copies the limits there.

  Input:
    KEYS[1] limits    hash: lane (or "*") -> "max_active rate per_ms"
    KEYS[2] blocked   set of "<p>|<lane>" taken off ring <p> at a limit
    KEYS[3] lanewake  zset of rate-limited lanes by the time their window opens (ms)
    KEYS[4] ring      list of lanes with waiting jobs (priority 0)
    KEYS[5] wake      the doorbell list
    KEYS[6] active    hash: lane -> counted active jobs, + 10^9 while blocked at max_active
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] lane, or "*" for the queue default
    ARGV[3] value, or "" to clear

  Output:
    the number of ring entries put back
]]
local prefix = ARGV[1]
local lane = ARGV[2]
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], lane)
else
  redis.call('HSET', KEYS[1], lane, ARGV[3])
end
local entries
if lane == '*' then
  entries = redis.call('SMEMBERS', KEYS[2])
  redis.call('DEL', KEYS[3])
else
  redis.call('ZREM', KEYS[3], lane)
  entries = {}
  for p = 0, 9 do entries[#entries + 1] = p .. '|' .. lane end
end
redis.call('HINCRBY', prefix .. 'meta', 'limits', 1)
local back = 0
local seen = {}
for _, entry in ipairs(entries) do
  if redis.call('SREM', KEYS[2], entry) == 1 then
    local bar = string.find(entry, '|', 1, true)
    local p = string.sub(entry, 1, bar - 1)
    local name = string.sub(entry, bar + 1)
    redis.call('RPUSH', p == '0' and KEYS[4] or prefix .. 'ring' .. p, name)
    back = back + 1
    if not seen[name] then
      seen[name] = true
      if (tonumber(redis.call('HGET', KEYS[6], name) or '0') or 0) >= 1000000000 then
        redis.call('HINCRBY', KEYS[6], name, -1000000000)
      end
    end
  end
end
if back > 0 then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[5], '1') > 64 then redis.call('LTRIM', KEYS[5], 0, 63) end
  end
end
return back
