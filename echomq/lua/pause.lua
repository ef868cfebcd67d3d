--[[
  pause: stop a queue from handing out jobs; admits go on.

  The pause flag holds the server time (ms) when the queue was paused. The
  claim script answers empty while it exists and admit stops ringing, so
  parked consumers stay parked. Jobs already active run to their end.

  Input:
    KEYS[1] paused  string, present while the queue is paused

  Output:
    1 when the queue was paused now, 0 when it already was
]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.call('SET', KEYS[1], now, 'NX') then return 1 end
return 0
