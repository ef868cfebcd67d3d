"""The reap's grace after an outage (echomq/reapgrace.py): a lease period after an outage
long enough for a live lease to run out, nothing after a shorter blip."""

from __future__ import annotations

import threading

from echomq.reapgrace import ReapGrace


def test_an_outage_of_a_third_of_a_lease_holds_the_reap_for_a_lease_from_the_return() -> None:
    g = ReapGrace(lease_s=3.0)
    g.failed(10.0)
    g.failed(10.5)  # the outage began at its first failure
    g.answered(11.0)
    assert g.hold(0.0) == 14.0
    assert g.hold(20.0) == 20.0  # a later deadline stays


def test_a_blip_shorter_than_a_third_of_a_lease_holds_nothing() -> None:
    g = ReapGrace(lease_s=3.0)
    g.failed(10.0)
    g.answered(10.9)
    assert g.hold(5.0) == 5.0
    g.answered(30.0)  # no outage under way: nothing changes
    assert g.hold(5.0) == 5.0


def test_failures_from_two_threads_count_as_one_outage() -> None:
    g = ReapGrace(lease_s=3.0)
    threads = [threading.Thread(target=g.failed, args=(10.0 + i / 100,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g.answered(11.2)
    assert g.hold(0.0) == 14.2
