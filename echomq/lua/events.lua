--[[
  events: the job events of one script call, a library the scripts that change a job's
  state include. A loader replaces the line "--!include events" with this text.

  event(kind, id, lane, attempt, extra) notes one event; flush_events(key) appends the
  call's events to the capped stream `key` ("emq:{q}:events") as one entry (field "e":
  a line per event, "kind job_id lane attempt[ extra]"; see echomq/events.py). None while
  meta "events" is "0"; the cap (meta "events_max", default 10000) counts events, about:
  MAXLEN ~ cap / events in this entry. The flag is read on the first event of the call,
  so a call that changes nothing pays nothing. An event is one line (a single
  concatenation: one string), the lines joined once per call: a table of a few parts per
  event grows and is collected at more cost than the line (callgrind: ~3,800 against
  ~5,800 instructions an event). ARGV[1] is the queue's key prefix.
]]
local ev_on, ev_max
local evs, ev_count = {}, 0
local function event(kind, id, lane, attempt, extra)
  if ev_on == nil then
    local m = redis.call('HMGET', ARGV[1] .. 'meta', 'events', 'events_max')
    ev_on, ev_max = m[1] ~= '0', tonumber(m[2] or '') or 10000
  end
  if not ev_on then return end
  local n = ev_count + 1
  if extra then
    evs[n] = kind .. ' ' .. id .. ' ' .. (lane or '') .. ' ' .. (attempt or '') .. ' ' .. extra
  else
    evs[n] = kind .. ' ' .. id .. ' ' .. (lane or '') .. ' ' .. (attempt or '')
  end
  ev_count = n
end
local function flush_events(key)
  if ev_count == 0 then return end
  redis.call('XADD', key, 'MAXLEN', '~', math.max(1, math.floor(ev_max / ev_count)), '*',
    'e', table.concat(evs, '\n', 1, ev_count))
  evs, ev_count = {}, 0
end
