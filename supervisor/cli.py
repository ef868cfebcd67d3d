"""``echomq-supervisor``: start, migrate, drill. Every flag also reads an ``ECHOMQ_*`` variable."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echomq.supervisor import logs
from echomq.supervisor.settings import (
    DEFAULT_BOOT_TIMEOUT_S,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_REDIS_URL,
    DEFAULT_SPILL_HORIZON_S,
    ENV_VARS,
    QueueSpec,
    Settings,
    env_value,
    parse_bool,
)

from echomq import loops
from echomq.errors import ConfigError, EchoMQError, FloorError, FloorSchemaError, HandlerNotFound
from echomq.ops.access import TOKEN_ENV as DASHBOARD_TOKEN_ENV

EXIT_USAGE = 2


# what --help shows as the default where Settings' own default does not say it
SHOWN_DEFAULTS = {
    "queue": "every queue the --tasks name",
    "handler": "none",
    "tasks": "none",
    "processes": "1",
    "floor_url": "none: Valkey alone",
    "outbox_url": "the floor's database",
    "durability": "folded with a floor, else volatile",
    "health_port": "none: no HTTP server",
    "config": "none",
}


def _shown_default(name: str) -> str:
    if name in SHOWN_DEFAULTS:
        return SHOWN_DEFAULTS[name]
    value = Settings.__dataclass_fields__[name].default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _env_help(name: str) -> str:
    return f"(default: {_shown_default(name)}; env {ENV_VARS[name]})"


def build_parser() -> argparse.ArgumentParser:
    """The `echomq-supervisor` argument parser: `start`, `migrate` and `drill`."""
    parser = argparse.ArgumentParser(prog="echomq-supervisor",
                                     description="Run and operate EchoMQ consumers.")
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start", help="run consumers for one or more queues")
    start.add_argument("--redis-url", help=f"Valkey/Redis URL {_env_help('redis_url')}")
    start.add_argument("--queue", action="append", help="queue name; repeat or comma-separate "
                       f"for several {_env_help('queue')}")
    start.add_argument("--handler", action="append", help="MODULE:CALLABLE, one per queue or "
                       f"one for all {_env_help('handler')}")
    start.add_argument("--tasks", action="append", help="MODULE[,MODULE] of @echomq.task "
                       "functions: run every task registered on each --queue (or on every queue "
                       f"the tasks name, without --queue) {_env_help('tasks')}")
    start.add_argument("--processes", action="append", type=int,
                       help=f"consumer processes per queue {_env_help('processes')}")
    start.add_argument("--floor-url", help=f"SQL floor URL {_env_help('floor_url')}")
    start.add_argument("--outbox-url", help="the database of the transactional outbox "
                       f"(tx=), the application's {_env_help('outbox_url')}")
    start.add_argument("--durability", choices=("volatile", "folded", "sync", "durable"),
                       help=f"durability dial {_env_help('durability')}")
    start.add_argument("--beat-ms", type=int, help=f"beat in ms {_env_help('beat_ms')}")
    start.add_argument("--lease-ms", type=int, help=f"lease in ms {_env_help('lease_ms')}")
    start.add_argument("--drain-timeout", type=float,
                       help=f"seconds to let jobs finish on SIGTERM {_env_help('drain_timeout')}")
    start.add_argument("--boot-timeout", type=float,
                       help="seconds a consumer may take to get ready before it is ended and "
                            f"forked again {_env_help('boot_timeout')}")
    start.add_argument("--health-port", type=int, help=f"HTTP port {_env_help('health_port')}")
    start.add_argument("--health-host", help=f"HTTP bind address {_env_help('health_host')}")
    start.add_argument("--max-memory-mb", type=int,
                       help=f"recycle a consumer over this RSS {_env_help('max_memory_mb')}")
    start.add_argument("--max-jobs", type=int,
                       help=f"recycle a consumer after this many jobs {_env_help('max_jobs')}")
    start.add_argument("--concurrency", type=int,
                       help=f"jobs in flight per consumer process {_env_help('concurrency')}")
    start.add_argument("--job-timeout", type=float,
                       help=f"default per-job time limit, seconds {_env_help('job_timeout')}")
    start.add_argument("--lane-limit", type=int,
                       help="default most active jobs per lane (1: strict lane order; "
                       f"Queue.set_lane_limit sets one lane's) {_env_help('lane_limit')}")
    start.add_argument("--spill-horizon", type=float,
                       help="seconds; jobs due later live on the floor only "
                       f"{_env_help('spill_horizon')}")
    start.add_argument("--keep-dead", type=int,
                       help=f"dead jobs kept per queue, newest first {_env_help('keep_dead')}")
    start.add_argument("--keep-dead-s", type=float,
                       help=f"seconds a dead job is kept {_env_help('keep_dead_s')}")
    start.add_argument("--log-json", action="store_true", default=None,
                       help=f"JSON log lines {_env_help('log_json')}")
    start.add_argument("--log-level", help=f"log level {_env_help('log_level')}")
    start.add_argument("--config", help=f"TOML or JSON file with queues {_env_help('config')}")
    start.add_argument("--doorbell", choices=("list", "marker"),
                       help="what the metronome parks on: BLPOP on the wake list (default) or "
                       f"BZPOPMIN on the marker zset {_env_help('doorbell')}")
    start.add_argument("--switch-doorbell", action="store_true", default=None,
                       help="record --doorbell in the queue's meta even if it names the other "
                       "kind (stop every consumer of the queue first) "
                       f"{_env_help('switch_doorbell')}")
    start.add_argument("--dashboard", action="store_true", default=None,
                       help=f"serve the dashboard at / of the health port "
                       f"{_env_help('dashboard')}")
    start.add_argument("--middleware", action="append",
                       help="MODULE:NAME of an echomq.Middleware (a class or factory is called "
                       f"in each consumer); repeat or comma-separate {_env_help('middleware')}")
    start.add_argument("--dashboard-actions", action="store_true", default=None,
                       help="let the dashboard retry, cancel, pause and resume, for holders "
                       "of the token in ECHOMQ_DASHBOARD_TOKEN (required) "
                       f"{_env_help('dashboard_actions')}")

    migrate = sub.add_parser("migrate", help="upgrade the floor's schema to head")
    migrate.add_argument("--floor-url", help="SQL floor URL, required; a relative sqlite:/// "
                         f"path is from the working directory (env {ENV_VARS['floor_url']})")
    migrate.add_argument("--outbox-url", help="also create the outbox table in this "
                         f"database (the application's; env {ENV_VARS['outbox_url']})")
    migrate.add_argument("--revision", default="head",
                         help="the revision to migrate to (default: %(default)s)")

    drill = sub.add_parser("drill", help="run a crash-recovery drill on a private server")
    drill.add_argument("scenario")
    drill.add_argument("--jobs", type=int, default=500, help="default: %(default)s")
    drill.add_argument("--processes", type=int, default=4, help="default: %(default)s")
    drill.add_argument("--floor-url", help="default: a SQLite floor in a temporary directory; "
                       "env ECHOMQ_FLOOR_URL")
    drill.add_argument("--report", choices=("table", "json"), default="table",
                       help="default: %(default)s")
    drill.add_argument("--doorbell", choices=("list", "marker"), default="list",
                       help="default: %(default)s")
    return parser


def _pick(args: argparse.Namespace, name: str) -> Any:
    value = getattr(args, name, None)
    return value if value is not None else env_value(name)


def _split(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def _number(name: str, value: Any, kind: type) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} ({ENV_VARS[name]}) must be a number, got {value!r}") from None


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _config_file(path: str) -> dict[str, Any]:
    text = Path(path).read_text()
    data: dict[str, Any] = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    return data


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Merge flags, environment and an optional config file into validated Settings."""
    config_path = _pick(args, "config")
    file_cfg = _config_file(config_path) if config_path else {}
    names = _split(_pick(args, "queue"))
    handlers = _split(_pick(args, "handler"))
    tasks = tuple(_split(_pick(args, "tasks")))
    if tasks:
        names = names or _task_queues(tasks)
    processes = [_number("processes", p, int) for p in _split(_pick(args, "processes"))]
    durability = _pick(args, "durability")
    specs: list[QueueSpec] = []
    for entry in file_cfg.get("queues", []):
        entry_tasks = tuple(_split(entry.get("tasks"))) or tasks
        if not entry.get("handler"):
            _check_has_tasks(entry["name"], entry_tasks)
        specs.append(QueueSpec(name=entry["name"], handler=entry.get("handler", ""),
                               processes=int(entry.get("processes", 1)),
                               durability=entry.get("durability", durability),
                               tasks=entry_tasks))
    for i, name in enumerate(names):
        if not handlers and not tasks:
            raise ConfigError(f"queue {name!r} needs --handler MODULE:CALLABLE or --tasks MODULE "
                              f"(or {ENV_VARS['handler']} / {ENV_VARS['tasks']})")
        handler = (handlers[i] if i < len(handlers) else handlers[-1]) if handlers else ""
        if not handler:
            _check_has_tasks(name, tasks)
        count = processes[i] if i < len(processes) else (processes[-1] if processes else 1)
        specs.append(QueueSpec(name=name, handler=handler, processes=count,
                               durability=durability, tasks=tasks))
    if not specs:
        raise ConfigError(f"no queue given: use --queue NAME --handler MODULE:CALLABLE "
                          f"(or {ENV_VARS['queue']} / {ENV_VARS['handler']}, or --config)")
    from echomq.keys import validate_name

    for spec in specs:
        validate_name(spec.name)
    log_json = _pick(args, "log_json")
    dashboard, actions = _pick(args, "dashboard"), _pick(args, "dashboard_actions")
    health_port = _number("health_port", _pick(args, "health_port"), int)
    return Settings(
        redis_url=_pick(args, "redis_url") or file_cfg.get("redis_url") or DEFAULT_REDIS_URL,
        queues=tuple(specs),
        floor_url=_pick(args, "floor_url") or file_cfg.get("floor_url"),
        outbox_url=_pick(args, "outbox_url") or file_cfg.get("outbox_url"),
        beat_ms=_number("beat_ms", _pick(args, "beat_ms"), int) or 1000,
        lease_ms=_number("lease_ms", _pick(args, "lease_ms"), int) or 30000,
        drain_timeout=_number("drain_timeout", _pick(args, "drain_timeout"), float)
        if _pick(args, "drain_timeout") is not None else DEFAULT_DRAIN_TIMEOUT_S,
        boot_timeout=_number("boot_timeout", _pick(args, "boot_timeout"), float)
        if _pick(args, "boot_timeout") is not None else DEFAULT_BOOT_TIMEOUT_S,
        health_port=health_port,
        health_host=_pick(args, "health_host") or "0.0.0.0",
        max_memory_mb=_number("max_memory_mb", _pick(args, "max_memory_mb"), int),
        max_jobs=_number("max_jobs", _pick(args, "max_jobs"), int),
        concurrency=_default(_number("concurrency", _pick(args, "concurrency"), int), 1),
        job_timeout=_number("job_timeout", _pick(args, "job_timeout"), float),
        lane_limit=_number("lane_limit", _pick(args, "lane_limit"), int),
        spill_horizon=_number("spill_horizon", _pick(args, "spill_horizon"), float)
        or DEFAULT_SPILL_HORIZON_S,
        keep_dead=_default(_number("keep_dead", _pick(args, "keep_dead"), int), 10_000),
        keep_dead_s=_default(_number("keep_dead_s", _pick(args, "keep_dead_s"), float),
                             30 * 24 * 3600.0),
        log_json=log_json if isinstance(log_json, bool) else parse_bool(log_json or "0"),
        log_level=_pick(args, "log_level") or "INFO",
        doorbell=_pick(args, "doorbell") or "list",
        switch_doorbell=_flag(_pick(args, "switch_doorbell")),
        dashboard=dashboard if isinstance(dashboard, bool) else parse_bool(dashboard or "0"),
        dashboard_actions=actions if isinstance(actions, bool) else parse_bool(actions or "0"),
        middleware=tuple(_split(_pick(args, "middleware"))),
    )


def _task_queues(modules: tuple[str, ...]) -> list[str]:
    """Every queue the tasks of these modules name (importing them)."""
    from echomq.supervisor.handlers import import_task_modules

    from echomq.task import queues

    import_task_modules(modules)
    found = queues()
    if not found:
        raise ConfigError(f"--tasks {','.join(modules)}: no @echomq.task functions registered")
    return found


def _check_has_tasks(queue: str, modules: tuple[str, ...]) -> None:
    from echomq.supervisor.handlers import import_task_modules

    from echomq.task import tasks_on

    if not modules:
        raise ConfigError(f"queue {queue!r} needs a handler or tasks")
    import_task_modules(modules)
    if not tasks_on(queue):
        raise ConfigError(f"queue {queue!r}: no task of --tasks {','.join(modules)} is on it "
                          "(and no --handler)")
def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else parse_bool(value or "0")


def cmd_start(args: argparse.Namespace) -> int:
    """`echomq-supervisor start`: run the arbiter until a signal stops it; the exit code."""
    from echomq.supervisor.arbiter import Arbiter
    from echomq.supervisor.health import Health

    _handler_import_path()  # before the settings: --tasks modules are imported there
    settings = settings_from_args(args)
    loops.loop_kind()  # a bad ECHOMQ_EVENT_LOOP fails here, not in every consumer's boot
    logs.setup(settings.log_json, settings.log_level)
    floor = _open_floor(settings.floor_url) if settings.floor_url else None
    from echomq.supervisor.relay import open_outbox
    from echomq.supervisor.scheduler import make_factory

    # the outbox: in the floor's database, or the one --outbox-url names
    outbox_engine = open_outbox(settings.outbox_url, floor)
    threads: dict[str, Any] = {}
    # without a floor: a scheduler for crons alone
    factory = make_factory(settings, floor, outbox_engine, threads)
    arbiter = Arbiter(settings, floor=floor, scheduler_factory=factory)
    listener = None
    if outbox_engine is not None and outbox_engine.dialect.name == "postgresql":
        from echomq.supervisor.relay import Listener

        listener = Listener(outbox_engine, lambda queue: [
            # a copy: the arbiter's thread adds queues while this one pokes
            t.poke() for name, t in list(threads.items()) if not queue or name == queue])
        listener.start()
    health = None
    if settings.health_port is not None:
        health = Health(settings.health_host, settings.health_port, settings.redis_url,
                        arbiter.snapshot, live_after_s=max(10.0, 3 * settings.beat_ms / 1000),
                        tally=arbiter.observed, dashboard=settings.dashboard,
                        dashboard_actions=settings.dashboard_actions)
        health.start()
        arbiter.forget_in_child.append(health.forget_in_child)
    # read by the dashboard (if any) by now: consumers, and the handler code they run,
    # are forked without the operator token
    os.environ.pop(DASHBOARD_TOKEN_ENV, None)
    try:
        return arbiter.run()
    finally:
        if listener is not None:
            listener.close()
        if outbox_engine is not None:
            from echomq.supervisor.relay import close_relay_pools

            close_relay_pools()
        if health is not None:
            health.stop()


def _handler_import_path() -> None:
    """Handlers import as an installed app's modules do: installed packages and PYTHONPATH
    first. The working directory (which ``python -m`` puts first) comes last, so a file
    there never shadows an installed module."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)] + [cwd]


def _open_floor(url: str) -> Any:
    from echomq.floor import Floor

    # every floor call bounded: a hung floor delays folding (on the scheduler's thread), and
    # the scheduler backs off and retries; the supervisor's loop never waits on the floor
    floor = Floor.from_url(url, busy_timeout_ms=300, connect_timeout_s=2,
                           statement_timeout_ms=5000, lock_timeout_ms=2000,
                           tcp_user_timeout_ms=10_000)
    import logging

    # a relative sqlite:/// path is shown resolved: which file this supervisor uses
    logs.event(logging.getLogger("echomq.supervisor"), "floor", "floor %s", floor.url_redacted)
    try:
        floor.check_at_head()
    except FloorSchemaError:
        raise
    except FloorError as exc:
        # the queue runs on Valkey alone until the floor answers; the scheduler catches up
        logging.getLogger("echomq.supervisor").warning(
            "floor %s unreachable at start (%s); continuing on Valkey alone",
            floor.url_redacted, exc)
    return floor


def cmd_migrate(args: argparse.Namespace) -> int:
    """`echomq-supervisor migrate`: bring the floor's schema to the newest revision."""
    import logging

    from echomq.floor import Floor

    log_json = _pick(args, "log_json")
    logs.setup(parse_bool(log_json or "0"), _pick(args, "log_level") or "INFO")
    urls = [u for u in (_pick(args, "floor_url"), _pick(args, "outbox_url")) if u]
    if not urls:
        raise ConfigError(f"migrate needs --floor-url (or {ENV_VARS['floor_url']}) "
                          f"or --outbox-url (or {ENV_VARS['outbox_url']})")
    for url in urls:  # the outbox's database gets the same (emq_-prefixed) tables
        # no statement bound: a migration may rewrite a large table; its lock waits bounded
        floor = Floor.from_url(url, statement_timeout_ms=0)
        try:
            floor.upgrade(args.revision)
            logs.event(logging.getLogger("echomq.migrate"), "migrated",
                       "floor %s at revision %s", floor.url_redacted,
                       floor.current_revision())
        finally:
            floor.dispose()
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    """`echomq-supervisor drill`: run fault scenarios and print their table."""
    from echomq.supervisor.drills.scenarios import main as drill_main

    return drill_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `echomq-supervisor` command; returns the exit code of DESIGN.md."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return cmd_start(args)
        if args.command == "migrate":
            return cmd_migrate(args)
        return cmd_drill(args)
    except HandlerNotFound as exc:
        print(f"echomq-supervisor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, FloorSchemaError) as exc:
        print(f"echomq-supervisor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EchoMQError as exc:
        print(f"echomq-supervisor: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
