--[[
  closed_read: the scheduler's read of the closed log, sorted for the floor.

  Reads up to ARGV[2] ids from the head of the closed log (jobs that completed, died or
  were cancelled while the queue folded). An id whose job is scheduled, waiting, active
  or blocked again, or spilled, is a new job under the same id (added after the old one
  was purged or dropped) whose floor row is current: it is left out. The others' rows
  are to go; those of them whose hash has field "spilled" (a job cancelled while
  spilled, a small stub) are listed again, so their rows' fields are copied into the
  stub first (backfill.lua). Read only: the scheduler trims what it read once the rows
  are closed. Job hashes are built inside.

  Input:
    KEYS[1] closed   list of closed job ids
    KEYS[2] spilled  set of ids held by the floor alone
    ARGV[1] key prefix "emq:{q}:"
    ARGV[2] the most ids to read

  Output:
    {read, done, stubs}: how many ids were read, the ids whose floor rows are to go, and those of
    them whose hash has field "spilled"
]]
local raw = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local done, stubs = {}, {}
for _, id in ipairs(raw) do
  local jk = ARGV[1] .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'state', 'spilled')
  local s = f[1]
  if not (s == 'scheduled' or s == 'waiting' or s == 'active' or s == 'blocked')
      and redis.call('SISMEMBER', KEYS[2], id) == 0 then
    done[#done + 1] = id
    if f[2] then stubs[#stubs + 1] = id end
  end
end
return {#raw, done, stubs}
