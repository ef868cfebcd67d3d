--[[
  retire: a dead consumer's claimer name leaves service, and its claims record is read.

  A consumer may die with a claim on its way to the server (the claim sent ahead of the
  batch it was running, a wake-up's claim it was waiting on). Run after the supervisor
  read the dead consumer's record, that claim would lease jobs no process holds: nobody
  extends or hands them back, their leases run out and the reap charges each a stall it
  never ran (one at max_stalls goes dead without running). So the mark "retired:<claimer>"
  is set in the same call as the read: a claim the server ran before it is in the record
  returned here (the supervisor hands those jobs back uncharged); one it runs after it
  leases nothing (claim.lua checks the mark). The mark expires after ARGV[1] ms.

  Input:
    KEYS[1] claims   the consumer's claims record (list of id, token pairs)
    KEYS[2] retired  the mark (string "1", expiring)
    ARGV[1] how long the mark is kept, in ms

  Output:
    the record's values, oldest first (id, token, id, token, ...; empty when none)
]]
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
return redis.call('LRANGE', KEYS[1], 0, -1)
