"""Drills: tooling that proves the delivery promise against real processes, not runtime.

- :mod:`.scenarios`: ``echomq-supervisor drill SCENARIO``, the faults and their reports;
- :mod:`.harness`: what the scenarios share (a private server, a floor, real
  supervisors, a paced producer, the ledger's facts);
- :mod:`.handler`: the drills' job handler, recording every execution in a ledger
  outside the queue;
- :mod:`.localredis`, :mod:`.localcluster`: a private Valkey (or redis-server) on a
  free port, and a private Valkey Cluster, also used by the demo, the benchmarks and
  the tests.

No runtime module imports this package; the CLI's ``drill`` subcommand loads it when
called.
"""
