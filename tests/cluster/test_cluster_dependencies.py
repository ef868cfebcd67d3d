"""Dependencies on a Valkey Cluster: the fan-in runs on the node owning the queue's slot."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

import echomq
from echomq import depend
from echomq.errors import UnknownDependency

from .conftest import spread_queues


def test_dependencies_and_a_chord_on_every_master(rc: RedisCluster) -> None:
    for name in spread_queues(rc, 3):
        q = echomq.Queue(name, redis=rc)
        members = q.add_many([("m", i) for i in range(5)])
        callback = q.add("cb", None, after=members)
        assert q.counts()["blocked"] == 1
        with pytest.raises(UnknownDependency):
            q.add("x", after=["nope"])
        ran = echomq.Consumer(q, lambda job: job.payload if job.name == "m"
                              else list(job.dependency_results().values())).run(burst=True)
        assert ran == 6
        assert q.get(callback).result == [0, 1, 2, 3, 4]
        assert depend.read_results(q.redis, q.keys, callback) == dict(zip(members, range(5),
                                                                          strict=True))
