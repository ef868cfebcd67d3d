--[[
  relayguard: the outbox relay's guard, a library admit.lua and schedule.lua include.
  A loader replaces the line "--!include relayguard" with this text.

  A relay's call passes, after its jobs, the guard (ms) and each job's outbox token (a
  random token its add wrote into the row); a producer's passes none. Each row has its
  doorbell "relayed:<id>:<token>": relayed_before says a relay admitted that row
  before (the doorbell exists), and ring_relayed rings it once the id's admit (or its
  refusal: the id was taken) is written, kept `guard` ms. A relay whose rows' delete
  failed after their admit reads the rows again: a job of theirs may have finished and
  been dropped by retention meanwhile, and only this doorbell says that row was
  admitted. A later add of the same id writes another token: a new add, idempotent on
  the id as any add. The result() of the add that wrote the row waits on its doorbell.
  After the tokens comes the value of the scheduler's leader lease the relay ran under
  ("<replica>|<fence>"; '' for none): relay_leads refuses the call when the lease holds
  another (a relay paused between its read of the rows and its admit while another
  leader relayed them, deleted them and cut their doorbells short admits nothing).
  ARGV[1] is the queue's key prefix; the lease key is built inside.
]]
local function relay_leads(guard, leader)
  if not guard or not leader or leader == '' then return true end
  return redis.call('GET', ARGV[1] .. 'leader') == leader
end

local function relay_doorbell(guard, id, token)
  if not guard then return nil end
  return ARGV[1] .. 'relayed:' .. id .. ':' .. token
end

local function relayed_before(doorbell)
  return doorbell ~= nil and redis.call('EXISTS', doorbell) == 1
end

local function ring_relayed(guard, doorbell, rang)
  if doorbell == nil then return end
  if not rang then redis.call('LPUSH', doorbell, '1') end
  redis.call('PEXPIRE', doorbell, guard)
end
