"""What the supervisor imports before it forks consumers or starts threads."""

from __future__ import annotations

import subprocess
import sys


def test_the_scheduler_brings_croniter_in_before_any_fork() -> None:
    # croniter's import runs a subprocess (platform.architecture runs `file`). Imported
    # first by a scheduler thread at its first cron, beside the arbiter forking a consumer,
    # the consumer kept the subprocess's exec-status pipe open and the thread hung for as
    # long as the consumer lived: no cron fired, no outbox row was relayed, the leader
    # lease lapsed. Loading the supervisor's start command loads it, in the main thread.
    # what `echomq-supervisor start` imports before it builds the arbiter (cli.cmd_start)
    code = ("import sys; from echomq.supervisor.scheduler import make_factory; "
            "print('croniter.croniter' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"


def test_the_outbox_listener_brings_psycopg_in_where_it_is_built() -> None:
    # built in the main thread before any fork: an outbox whose engine uses another driver
    # (postgresql+psycopg2) would leave psycopg to be imported first by the listening
    # thread, whose import may run a subprocess to find libpq, as croniter's did
    code = ("import sys, sqlalchemy; from echomq.supervisor.relay import Listener; "
            "assert 'psycopg' not in sys.modules; "
            "Listener(sqlalchemy.create_engine('sqlite://'), lambda queue: None); "
            "print('psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"


def test_an_outbox_listener_without_psycopg_leaves_the_relay_to_its_beat() -> None:
    # an outbox on postgresql+psycopg2 with psycopg (3) not installed: the supervisor starts,
    # with a warning, and the relay runs each beat (no LISTEN thread)
    code = ("import sys, logging, sqlalchemy; sys.modules['psycopg'] = None; "
            "logging.basicConfig(); "
            "from echomq.supervisor.relay import Listener; "
            "lis = Listener(sqlalchemy.create_engine('sqlite://'), lambda queue: None); "
            "lis.start(); print(lis._thread.is_alive())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    assert "the relay runs each beat" in out.stderr
