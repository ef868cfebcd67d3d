"""/metrics on prometheus_client: one collector that reads, at scrape time, the arbiter's
snapshot, Valkey (depth by state, oldest waiting job) and the consumers' observations.

Job duration and pickup latency histograms and jobs finished by outcome, per queue and
job name, come from the children over their pipes (see observations.py); the rest is
read when scraped, so nothing is kept twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

import redis
from echomq.supervisor.observations import DURATION_BUCKETS, PICKUP_BUCKETS, Tally
from echomq.supervisor.recycle import own_figures, rss_bytes
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from echomq import scripts
from echomq.job import STATES
from echomq.keys import Keys

VALKEY_BUDGET_S = 2.0  # a scrape's reads of Valkey, all queues (the answer's bound is 5 s)
SURVEY_LANES = 100  # lanes whose head job is looked at for the oldest (bounded per scrape)


def _histogram(name: str, help_text: str, data: dict[tuple[str, str], list[Any]],
               bounds: tuple[float, ...]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=["queue", "name"])
    for (queue, job_name), (_count, total, buckets) in sorted(data.items()):
        cumulative = list(accumulate(buckets))
        edges = [*(str(b) for b in bounds), "+Inf"]
        family.add_metric([queue, job_name], list(zip(edges, cumulative, strict=True)), total)
    return family


class SupervisorCollector:
    """Everything /metrics shows, gathered per scrape."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], client: redis.Redis,
                 tally: Tally | None) -> None:
        self.snapshot = snapshot
        self.client = client
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        """The metric families of one scrape, read from the snapshot, Valkey and the tally."""
        snap = self.snapshot()
        queues = snap["queues"]
        up = GaugeMetricFamily("echomq_up", "1 when Valkey answered this scrape")
        depth = GaugeMetricFamily("echomq_queue_jobs", "Jobs per state (dead, cancelled: kept "
                                  "now; spilled: on the floor only)", labels=["queue", "state"])
        totals = CounterMetricFamily("echomq_jobs", "Jobs finished per outcome since the queue "
                                     "began", labels=["queue", "outcome"])
        oldest = GaugeMetricFamily("echomq_oldest_waiting_seconds", "Age of the oldest job at "
                                   "the head of a lane", labels=["queue"])
        paused = GaugeMetricFamily("echomq_queue_paused", "1 while the queue is paused",
                                   labels=["queue"])
        reachable = 1.0
        # the scrape answers within its connection's bound: once Valkey has taken this
        # long (a frozen node, calls each waiting out their socket timeout), the queues
        # not read yet are left out, and echomq_up says 0
        deadline = time.monotonic() + VALKEY_BUDGET_S
        for name in queues:
            k = Keys(name)
            if time.monotonic() > deadline:
                reachable = 0.0
                continue
            try:
                values = scripts.counts(self.client, k, fast=True)  # O(1) in the lanes
                _, _, head_ms, now_ms, _ = scripts.survey(self.client, k, SURVEY_LANES, 0,
                                                         SURVEY_LANES)
            except redis.exceptions.RedisError:
                reachable = 0.0
                continue
            kept = (*values[:5], values[8], values[10])
            for state, value in zip(STATES, kept, strict=True):
                if state != "completed":
                    depth.add_metric([name, state], float(value))
            depth.add_metric([name, "spilled"], float(values[6]))
            for outcome, value in (("completed", values[3]), ("retried", values[5]),
                                   ("dead", values[4])):
                totals.add_metric([name, outcome], float(value))
            oldest.add_metric([name], max(0.0, (now_ms - head_ms) / 1000) if head_ms >= 0
                              else 0.0)
            paused.add_metric([name], float(values[9]))
        up.add_metric([], reachable)
        yield from (up, depth, totals, oldest, paused)
        yield from self._children(queues)
        yield from self._floor(queues)
        yield from self._outbox(queues)
        yield from self._observed()
        own = own_figures()
        for metric_name, kind, help_text, value in (
                ("echomq_supervisor_rss_bytes", GaugeMetricFamily, "Supervisor RSS",
                 own["rss_bytes"]),
                ("echomq_supervisor_cpu_seconds", CounterMetricFamily, "Supervisor CPU time",
                 own["cpu_seconds"]),
                ("echomq_supervisor_open_fds", GaugeMetricFamily, "Supervisor open fds",
                 own["open_fds"])):
            family = kind(metric_name, help_text)
            family.add_metric([], float(value))
            yield family

    def _children(self, queues: dict[str, Any]) -> Iterator[Metric]:
        specs: list[tuple[str, Any, str, Callable[[dict[str, Any]], float]]] = [
            ("echomq_consumers", GaugeMetricFamily, "Consumer processes alive",
             lambda v: v["children"]),
            ("echomq_consumers_busy", GaugeMetricFamily, "Consumer processes running jobs",
             lambda v: v["busy"]),
            ("echomq_consumer_restarts", CounterMetricFamily, "Consumer processes respawned",
             lambda v: v["restarts"]),
            ("echomq_consumer_rss_bytes", GaugeMetricFamily,
             "Summed RSS of the consumer processes",
             lambda v: sum(rss_bytes(p) or 0 for p in v["pids"])),
            ("echomq_metronome_rings", CounterMetricFamily, "Doorbell rings taken",
             lambda v: v["rings"]),
            ("echomq_promoted", CounterMetricFamily, "Deferred jobs promoted by this supervisor",
             lambda v: v["promoted"]),
            ("echomq_reaped", CounterMetricFamily, "Expired leases reaped by this supervisor",
             lambda v: v["reaped"]),
            ("echomq_dead_trimmed", CounterMetricFamily,
             "Dead jobs dropped by retention (keep_dead / keep_dead_s) by this supervisor",
             lambda v: v.get("dead_trimmed", 0)),
        ]
        for metric_name, kind, help_text, read in specs:
            family = kind(metric_name, help_text, labels=["queue"])
            for name, v in queues.items():
                family.add_metric([name], float(read(v)))
            yield family
        available = GaugeMetricFamily(
            "echomq_valkey_available", "1 while the queue's calls succeed; 0 while Valkey is "
            "unreachable or refuses writes", labels=["queue"])
        refusals = CounterMetricFamily(
            "echomq_valkey_refusals", "Calls Valkey refused, by error code (OOM, READONLY, "
            "NOREPLICAS, MISCONF, BUSY)", labels=["queue", "code"])
        for name, v in queues.items():
            available.add_metric([name], 1.0 if v.get("healthy", True) else 0.0)
            for code, count in sorted(v.get("refusals", {}).items()):
                refusals.add_metric([name, code], float(count))
        yield from (available, refusals)
        wait = SummaryMetricFamily("echomq_claim_to_start_seconds", "Wait between a job's "
                                   "claim and its start", labels=["queue"])
        for name, v in queues.items():
            wait.add_metric([name], int(v["claim_jobs"]), v["claim_wait_us"] / 1e6)
        yield wait

    def _outbox(self, queues: dict[str, Any]) -> Iterator[Metric]:
        relays = [(n, v["scheduler"]) for n, v in queues.items()
                  if v["scheduler"] is not None and "outbox" in v["scheduler"]]
        if not relays:
            return
        up = GaugeMetricFamily("echomq_outbox_up", "1 when the outbox relay's last batch "
                               "went through", labels=["queue"])
        relayed = CounterMetricFamily("echomq_outbox_relayed", "Outbox rows admitted by "
                                      "this supervisor's relay", labels=["queue"])
        for n, s in relays:
            up.add_metric([n], 1.0 if s["outbox"] == "ok" else 0.0)
            relayed.add_metric([n], float(s.get("relayed", 0)))
        yield from (up, relayed)

    def _floor(self, queues: dict[str, Any]) -> Iterator[Metric]:
        sched = [(n, v["scheduler"]) for n, v in queues.items()
                 if v["scheduler"] is not None and v["scheduler"].get("floor") != "none"]
        if not sched:
            return
        up = GaugeMetricFamily("echomq_floor_up", "1 when the floor answered its last write",
                               labels=["queue"])
        folded = CounterMetricFamily("echomq_floor_folded", "Jobs written to the floor",
                                     labels=["queue"])
        lag = GaugeMetricFamily("echomq_floor_backlog", "Floor lag: jobs waiting to be folded",
                                labels=["queue"])
        more = [
            (GaugeMetricFamily, "echomq_floor_closed_backlog",
             "Finished jobs whose rows wait to close", "closed_backlog"),
            (CounterMetricFamily, "echomq_floor_backlog_dropped",
             "Log entries dropped over the bound (recovered by a sweep)", "backlog_dropped"),
            (CounterMetricFamily, "echomq_floor_orphans_closed",
             "Floor rows of finished jobs closed by the orphan pass", "orphans_closed"),
            (CounterMetricFamily, "echomq_floor_set_aside",
             "Malformed jobs or floor rows set aside as dead", "buried"),
            (CounterMetricFamily, "echomq_floor_late_beats",
             "Scheduler beats begun over 1.5 beats after the last (folds and closes lagged)",
             "late_beats"),
        ]
        families = [(kind(name, help_text, labels=["queue"]), field)
                    for kind, name, help_text, field in more]
        for n, s in sched:
            up.add_metric([n], 1.0 if s.get("floor") == "ok" else 0.0)
            folded.add_metric([n], float(s.get("folded", 0)))
            lag.add_metric([n], float(s.get("backlog", 0)))
            for family, field in families:
                family.add_metric([n], float(s.get(field, 0)))
        yield from (up, folded, lag)
        yield from (family for family, _ in families)

    def _observed(self) -> Iterator[Metric]:
        if self.tally is None:
            return
        duration, pickup, finished = self.tally.copy()
        yield _histogram("echomq_job_duration_seconds", "Handler run time per job",
                         duration, DURATION_BUCKETS)
        yield _histogram("echomq_pickup_latency_seconds", "Admission to first start "
                         "(delayed jobs include their delay)", pickup, PICKUP_BUCKETS)
        family = CounterMetricFamily("echomq_jobs_finished", "Jobs run by this supervisor's "
                                     "consumers, per outcome", labels=["queue", "name",
                                                                       "outcome"])
        for (queue, name, outcome), count in sorted(finished.items()):
            family.add_metric([queue, name, outcome], float(count))
        yield family


def build_registry(snapshot: Callable[[], dict[str, Any]], client: redis.Redis,
                   tally: Tally | None = None) -> CollectorRegistry:
    """A registry holding only the supervisor's collector (no process defaults)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SupervisorCollector(snapshot, client, tally))
    return registry
