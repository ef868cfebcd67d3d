--[[
  resume: let a paused queue hand out jobs again.

  Drops the pause flag and, when lanes hold waiting jobs (admitted while
  paused), rings the doorbell so parked consumers wake and claim them.

  Input:
    KEYS[1] paused  string, present while the queue is paused
    KEYS[2] ring    list of lanes with waiting jobs
    KEYS[3] wake    the doorbell list

  Output:
    1 when the queue was resumed now, 0 when it was not paused
]]
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
if redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, 63)
end
return 1
