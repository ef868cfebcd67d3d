--[[
  resume: let a paused queue hand out jobs again.

  Drops the pause flag and, when lanes hold waiting jobs (admitted while
  paused), rings the doorbell so parked consumers wake and claim them.

  Input:
    KEYS[1] paused  string, present while the queue is paused
    KEYS[2] ring    list of lanes with waiting jobs
    KEYS[3] wake    the doorbell list
    KEYS[4] prios   zset of priority levels above 0 in use (their rings may hold work)
    ARGV[1] key prefix "emq:{q}:" (the meta hash and the marker doorbell are built from it)

  Output:
    1 when the queue was resumed now, 0 when it was not paused
]]
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if redis.call('LLEN', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[4]) == 1 then
  if redis.call('HGET', ARGV[1] .. 'meta', 'doorbell') == 'marker' then
    redis.call('ZADD', ARGV[1] .. 'marker', 0, '0')
  else
    if redis.call('LPUSH', KEYS[3], '1') > 64 then redis.call('LTRIM', KEYS[3], 0, 63) end
  end
end
return 1
