"""``echomq``: look into and operate queues from a shell.

    echomq --redis-url URL queues
    echomq --redis-url URL stats QUEUE [--json]
    echomq --redis-url URL jobs QUEUE --state STATE [--limit N] [--cursor C] [--json]
    echomq --redis-url URL show QUEUE JOB_ID [--json]
    echomq --redis-url URL retry QUEUE [JOB_ID ...]
    echomq --redis-url URL cancel QUEUE JOB_ID
    echomq --redis-url URL pause QUEUE | resume QUEUE
    echomq --redis-url URL purge QUEUE --state completed|dead|cancelled
    echomq --redis-url URL crons QUEUE [--json]
    echomq --redis-url URL limit QUEUE [--lane LANE] [--max-active N] [--rate R] [--per-s S]
                                       [--clear]
    echomq --redis-url URL dashboard [--host H] [--port 8081] [--allow-actions]

``--redis-url`` falls back to ``ECHOMQ_REDIS_URL``. Exit codes: 0 done, 1 not found or
refused (or the server could not be reached), 2 usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis.exceptions

from echomq.connection import DEFAULT_URL, client_from_url, describe, redact_url
from echomq.errors import ConfigError, ConnectionFailed, EchoMQError, InvalidName
from echomq.job import STATES
from echomq.ops import limitcmd
from echomq.ops.views import job_record, queue_exists, summary
from echomq.queue import PURGEABLE, Queue

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
RETRY_BATCH = 1000


class Refused(Exception):
    """Not found or not allowed: exit 1 with this message."""


def build_parser() -> argparse.ArgumentParser:
    """The `echomq` argument parser: global `--redis-url` and `--json`, one subcommand each."""
    parser = argparse.ArgumentParser(prog="echomq", description="Look into and operate "
                                     "EchoMQ queues.")
    parser.add_argument("--redis-url", help=f"Valkey/Redis URL (default: {DEFAULT_URL}; env "
                        "ECHOMQ_REDIS_URL)")
    parser.add_argument("--json", action="store_true", help="JSON output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="JSON output")
        return p

    command("queues", "every queue with its counts")
    command("stats", "counts, totals, pause state and busiest lanes").add_argument("queue")
    p = command("jobs", "list jobs in a state, oldest first")
    p.add_argument("queue")
    p.add_argument("--state", required=True, choices=STATES)
    p.add_argument("--limit", type=int, default=20, help="at most this many (default: %(default)s)")
    p.add_argument("--cursor", default="", help="the next_cursor of a previous listing")
    p = command("show", "one job in full")
    p.add_argument("queue")
    p.add_argument("job_id")
    p = command("retry", "dead jobs back to waiting (all when none named)")
    p.add_argument("queue")
    p.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    p = command("cancel", "cancel a waiting, scheduled or active job")
    p.add_argument("queue")
    p.add_argument("job_id")
    command("pause", "stop handing out jobs (admits go on)").add_argument("queue")
    command("resume", "hand out jobs again").add_argument("queue")
    p = command("purge", "delete every job in a finished state")
    p.add_argument("queue")
    p.add_argument("--state", required=True, choices=PURGEABLE)
    command("crons", "the queue's crons: schedule, job, last and next occurrence"
            ).add_argument("queue")
    limitcmd.add_parser(command)
    p = command("events", "the queue's job events, oldest kept first")
    p.add_argument("queue")
    p.add_argument("--follow", "-f", action="store_true", help="then wait for new ones "
                   "until interrupted")
    p.add_argument("--since", default="0", help="after this event id ('$': only new ones)")
    p = command("dashboard", "serve the web page")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8081, help="port (default: %(default)s)")
    p.add_argument("--allow-actions", action="store_true",
                   help="offer retry/cancel/pause/resume to holders of the token in "
                   "ECHOMQ_DASHBOARD_TOKEN, which must be set (read-only without)")
    return parser


# --- output -------------------------------------------------------------------------

def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns as wide as their widest cell."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any, width: int = 48) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"


# --- commands -----------------------------------------------------------------------

def _queue(client: Any, name: str, must_exist: bool = True) -> Queue:
    q = Queue(name, redis=client)
    if must_exist and not queue_exists(q):
        raise Refused(f"unknown queue {name!r} (nothing of it on {describe(client)})")
    return q


COUNT_COLUMNS = ("waiting", "scheduled", "active", "completed", "dead", "cancelled")


def cmd_queues(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq queues`: every registered queue with its counts and pause state."""
    rows = [summary(Queue(name, redis=client)) for name in Queue.registered(client)]
    text = table(["queue", *COUNT_COLUMNS, "paused"],
                 [[r["queue"], *(r[c] for c in COUNT_COLUMNS), "yes" if r["paused"] else ""]
                  for r in rows]) if rows else "no queues"
    return rows, text


def cmd_stats(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq stats QUEUE`: counts, retries, spills, lanes, oldest waiting age, busiest lanes."""
    s = summary(_queue(client, args.queue), top_lanes=5)
    lines = [f"queue {s['queue']}" + ("  (PAUSED)" if s["paused"] else "")]
    lines += [f"  {k:<10} {s[k]}" for k in (*COUNT_COLUMNS, "retried", "spilled", "lanes")]
    if s["oldest_waiting_s"] is not None:
        lines.append(f"  oldest waiting: {s['oldest_waiting_s']:.1f} s")
    if s["busiest_lanes"]:
        lines.append("  busiest lanes: " + ", ".join(
            f"{x['lane']} ({x['waiting']})" for x in s["busiest_lanes"]))
    return s, "\n".join(lines)


def cmd_jobs(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq jobs QUEUE STATE`: one page of jobs in a state, with the cursor of the next."""
    q = _queue(client, args.queue)
    try:
        jobs, nxt = q.jobs_page(args.state, limit=args.limit, cursor=args.cursor)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    data = {"queue": q.name, "state": args.state, "jobs": [job_record(j) for j in jobs],
            "next_cursor": nxt}
    text = table(["id", "name", "lane", "attempts", "created", "error/payload"],
                 [[j.id, j.name, j.lane, f"{j.attempts}/{j.max_attempts}", _when(j.created_ms),
                   _short(j.error.strip().splitlines()[-1] if j.error else j.payload)]
                  for j in jobs]) if jobs else f"no {args.state} jobs"
    if nxt:
        text += f"\nmore: --cursor {nxt}"
    return data, text


def cmd_show(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq show QUEUE JOB_ID`: every field of one job; `Refused` when it does not exist."""
    q = _queue(client, args.queue)
    job = q.get(args.job_id)
    if job is None:
        raise Refused(f"unknown job {args.job_id!r} in queue {q.name!r}")
    rec = job_record(job)
    lines = [f"{k:<13} {_when(v) if k.endswith('_ms') else _short(v, 200)}"
             for k, v in rec.items()
             if k not in ("error", "after", "dependents") and v not in (None, "")]
    lines += dependency_lines(q, job)
    if job.error:
        lines += ["error:", job.error.rstrip()]
    return rec, "\n".join(lines)


SHOWN_DEPENDENCIES = 20  # `echomq show` lists this many of each side, then counts the rest


def dependency_lines(q: Queue, job: Any) -> list[str]:
    """`echomq show`: the jobs this one waits for (with their states) and those waiting
    for it (at most SHOWN_DEPENDENCIES of each, then how many more)."""
    lines: list[str] = []
    for title, ids in (("waits for", job.after), ("waited by", job.dependents)):
        if not ids:
            continue
        shown = list(ids[:SHOWN_DEPENDENCIES])
        pipe = q.redis.pipeline(transaction=False)
        for jid in shown:
            pipe.hget(q.keys.job(jid), "state")
        states = [s.decode() if isinstance(s, bytes) else (s or "gone") for s in pipe.execute()]
        lines.append(f"{title}:")
        lines += [f"  {jid}  {state}" for jid, state in zip(shown, states, strict=True)]
        if len(ids) > len(shown):
            lines.append(f"  ... and {len(ids) - len(shown)} more")
    return lines


def cmd_retry(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq retry QUEUE [JOB_ID...]`: move the named (or all) dead jobs back to waiting."""
    q = _queue(client, args.queue)
    if args.job_ids:
        moved = q.retry_dead(args.job_ids)
    else:  # every dead job, a bounded batch per script call
        # a job that stays dead (its dependency cannot come back) goes to the end of the
        # dead set and counts nothing, so a short batch does not mean the set is done:
        # enough batches to see each dead job once
        moved = 0
        for _ in range(q.counts()["dead"] // RETRY_BATCH + 2):
            moved += q.retry_dead(limit=RETRY_BATCH)
            if q.counts()["dead"] == 0:
                break
    data = {"queue": q.name, "retried": moved}
    if args.job_ids and moved < len(args.job_ids):
        raise Refused(f"retried {moved} of {len(args.job_ids)}: the others are not dead jobs "
                      f"of queue {q.name!r}", data)
    return data, f"retried {moved} job(s)"


def cmd_cancel(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq cancel QUEUE JOB_ID`: cancel a waiting, scheduled or active job (an active
    one's handler is stopped); `Refused` says why not."""
    q = _queue(client, args.queue)
    if q.cancel(args.job_id):
        return {"queue": q.name, "id": args.job_id, "cancelled": True}, f"cancelled {args.job_id}"
    job = q.get(args.job_id)
    data = {"queue": q.name, "id": args.job_id, "cancelled": False,
            "state": job.state if job else None}
    if job is None:
        raise Refused(f"unknown job {args.job_id!r} in queue {q.name!r}", data)
    raise Refused(f"job {args.job_id!r} is {job.state}: only waiting, scheduled or active jobs "
                  "can be cancelled", data)


def cmd_pause(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq pause QUEUE`: stop claims (admits go on); says whether it changed anything."""
    q = _queue(client, args.queue, must_exist=False)
    changed = q.pause()
    return ({"queue": q.name, "paused": True, "changed": changed},
            f"paused {q.name}" if changed else f"{q.name} was already paused")


def cmd_resume(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq resume QUEUE`: claim again, ringing the doorbell; says if anything changed."""
    q = _queue(client, args.queue)
    changed = q.resume()
    return ({"queue": q.name, "paused": False, "changed": changed},
            f"resumed {q.name}" if changed else f"{q.name} was not paused")


def cmd_purge(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq purge QUEUE STATE`: delete every job in a finished state; says how many."""
    q = _queue(client, args.queue)
    n = q.purge(args.state)
    return {"queue": q.name, "state": args.state, "purged": n}, f"purged {n} {args.state} job(s)"


def cmd_crons(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq crons QUEUE`: the queue's crons with their last and next occurrence."""
    crons = _queue(client, args.queue).crons()
    data = [dataclasses.asdict(c) for c in crons]
    text = table(["key", "expr", "tz", "name", "lane", "last (UTC)", "next (UTC)", "payload"],
                 [[c.key, c.expr, c.tz, c.name, c.lane, _when(c.last_ms), _when(c.next_ms),
                   _short(c.payload)] for c in crons]) if crons else "no crons"
    return data, text


def cmd_limit(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq limit QUEUE ...`: show or set the queue-wide limit or a lane's."""
    return limitcmd.cmd_limit(_queue(client, args.queue, must_exist=False), args)
def cmd_events(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq events QUEUE [--follow]`: print each event as it is read (a JSON object a
    line with --json); with --follow, wait for more until interrupted."""
    q = _queue(client, args.queue, must_exist=False)
    try:
        stream = q.events(since=args.since, block_s=None if args.follow else 0)
        for ev in stream:
            if args.json:
                print(ev.to_json(), flush=True)
            else:
                extra = " ".join(f"{k}={_short(v, 60)}" for k, v in ev.data.items())
                attempt = f"attempt={ev.attempt}" if ev.attempt is not None else ""
                print(f"{ev.at.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}  {ev.kind:<9}  "
                      f"{ev.job_id}  lane={ev.lane} {attempt} {extra}".rstrip(), flush=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return None, ""


def cmd_dashboard(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`echomq dashboard`: serve the dashboard until interrupted; `Refused` if it cannot bind."""
    from echomq.ops.dashboard import serve

    try:
        serve(client, args.host, args.port, allow_actions=args.allow_actions)
    except OSError as exc:  # the port is taken, or the address is not this host's
        raise Refused(f"cannot serve the dashboard on {args.host}:{args.port}: "
                      f"{exc.strerror or exc}") from None
    return None, ""


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], tuple[Any, str]]] = {
    "queues": cmd_queues, "stats": cmd_stats, "jobs": cmd_jobs, "show": cmd_show,
    "retry": cmd_retry, "cancel": cmd_cancel, "pause": cmd_pause, "resume": cmd_resume,
    "purge": cmd_purge, "crons": cmd_crons, "limit": cmd_limit, "dashboard": cmd_dashboard,
    "events": cmd_events,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `echomq` command; exit code 0 done, 1 refused or unreachable, 2 usage."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    url = args.redis_url or os.environ.get("ECHOMQ_REDIS_URL") or DEFAULT_URL
    where = redact_url(url)
    try:
        client = client_from_url(url, socket_connect_timeout=3.0, socket_timeout=30.0)
        data, text = COMMANDS[args.command](client, args)
    except Refused as exc:
        message = exc.args[0]
        if args.json and len(exc.args) > 1:
            print(json.dumps({**exc.args[1], "error": message}))
        print(f"echomq: {message}", file=sys.stderr)
        return EXIT_REFUSED
    except ConnectionFailed as exc:
        print(f"echomq: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        print(f"echomq: cannot reach Valkey/Redis at {where}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except redis.exceptions.RedisError as exc:
        print(f"echomq: Valkey/Redis at {where} answered an error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (InvalidName, ConfigError) as exc:
        print(f"echomq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EchoMQError as exc:
        print(f"echomq: {exc} ({where})", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return EXIT_OK
    if args.command not in ("dashboard", "events"):  # these print as they go
        print(json.dumps(data, ensure_ascii=False, default=str) if args.json else text)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
