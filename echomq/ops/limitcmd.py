"""``echomq limit QUEUE``: show or set flow limits, the queue-wide one or a lane's.

    echomq limit QUEUE                                   # every limit of the queue
    echomq limit QUEUE --max-active 10 --rate 100 --per-s 1   # the queue-wide limit
    echomq limit QUEUE --lane user-7 --max-active 1      # one lane ("*": the default)
    echomq limit QUEUE [--lane L] --clear
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from echomq.errors import ConfigError
from echomq.queue import Queue


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The `limit` subcommand's arguments."""
    p = command("limit", "show or set the queue-wide limit, or a lane's (--lane)")
    p.add_argument("queue")
    p.add_argument("--lane", help="a lane, or '*' for the default of every lane "
                   "(without: the queue-wide limit)")
    p.add_argument("--max-active", type=int, help="at most this many jobs active at once")
    p.add_argument("--rate", type=int, help="at most this many starts per --per-s seconds")
    p.add_argument("--per-s", type=float, help="the rate window in seconds (default 1)")
    p.add_argument("--clear", action="store_true", help="remove the limit")


def _text(limit: dict[str, Any]) -> str:
    parts = []
    if limit["max_active"] is not None:
        parts.append(f"max_active {limit['max_active']}")
    if limit["rate"] is not None:
        parts.append(f"rate {limit['rate']} per {limit['per_s'] or 1:g}s")
    return ", ".join(parts) or "none"


def cmd_limit(q: Queue, args: argparse.Namespace) -> tuple[Any, str]:
    """Show the limits, or set (or clear) one; ConfigError (exit 2) for a bad value."""
    given = (args.max_active, args.rate, args.per_s)
    if args.clear and any(v is not None for v in given):
        raise ConfigError("give --clear or limits, not both")
    if not args.clear and all(v is None for v in given):
        if args.lane is not None:
            raise ConfigError("--lane needs --max-active, --rate or --clear")
        data = {"queue": q.name, "queue_limit": q.queue_limit(), "lanes": q.lane_limits()}
        lines = [f"queue {q.name}: {_text(data['queue_limit'])}"]
        lines += [f"lane {lane}: {_text(v)}" for lane, v in sorted(data["lanes"].items())]
        return data, "\n".join(lines)
    try:
        if args.lane is None:
            q.set_queue_limit(*given)
            now = q.queue_limit()
        else:
            q.set_lane_limit(args.lane, *given)
            now = q.lane_limits().get(args.lane, {"max_active": None, "rate": None,
                                                  "per_s": None})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    what = "queue-wide" if args.lane is None else f"lane {args.lane}"
    return ({"queue": q.name, "lane": args.lane, "limit": now},
            f"{q.name}: {what} limit {_text(now)}")
