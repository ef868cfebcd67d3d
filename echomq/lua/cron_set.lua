--[[
  cron_set: add a cron to the queue, or replace the one with the same key.

  The cron's last occurrence starts at the server's now (or stays later, for a
  replaced cron whose last admitted occurrence was later), so only occurrences
  after this call are admitted. A cron replaced with the same expression and
  time zone (an application registering its crons at every start) keeps its
  last occurrence: what fell due meanwhile and no leader admitted yet is still
  admitted. Bumps the meta field "crons", which the
  scheduler's lead call returns, so the scheduler re-reads the crons.

  Input:
    KEYS[1] crons     hash: cron key -> spec (JSON: expr, name, payload, lane, tz, rev, ...)
    KEYS[2] cronlast  hash: cron key -> due time (ms) of the last occurrence admitted
    KEYS[3] meta      queue settings hash (field "crons": a version counter)
    ARGV[1] cron key
    ARGV[2] spec (JSON)

  Output:
    { 1 when the key is new, 0 when a cron was replaced; the cron's last (ms) }
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local same = false
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok1, was = pcall(cjson.decode, old)
  local ok2, spec = pcall(cjson.decode, ARGV[2])
  same = ok1 and ok2 and type(was) == 'table' and type(spec) == 'table'
    and was['expr'] == spec['expr'] and was['tz'] == spec['tz']
end
local new = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '') or 0
if last < now and not (same and last > 0) then
  last = now
  redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', now))
end
redis.call('HINCRBY', KEYS[3], 'crons', 1)
return { new, string.format('%d', last) }
