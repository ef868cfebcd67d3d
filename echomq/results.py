"""Waiting for a job's result on its per-job doorbell, without polling.

A waiter runs ``await.lua``: a finished job answers at once; otherwise the job
is marked as awaited (atomically with settle), and the waiter parks on one
``BLMOVE done:<id> done:<id> LEFT LEFT`` on a connection of its own. The
settle that finishes a marked job pushes one token ("c" or "d") onto that
list; a BLMOVE from a list onto itself rotates the token back, so the server
hands the same token to every parked waiter in turn and it stays for late
arrivals. While parked, a waiter sends nothing.

The deadline is kept on the client: the server checks blocking timeouts only
on its ``hz`` tick (up to ~100 ms late), so the BLMOVE's own timeout is a
fallback a little past the deadline, and the socket read carries the exact
one; a read that times out drops the connection (the server forgets the
blocked call with it). The pure part (:func:`outcome`) serves the sync and the
asyncio waiter alike.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.exceptions

from echomq import forksafe, scripts
from echomq.errors import JobFailed, JobNotFound
from echomq.keys import Keys, validate_job_id

SERVER_GRACE_S = 1.0  # the server's own timeout, past the client's deadline
SLICE_S = 300.0  # timeout=None parks in slices this long (one command per slice)
WAITERS_MAX = 1 << 20  # waiters are bounded by the caller's threads/tasks, not by a pool


@dataclass(frozen=True)
class Pending:
    """The job is not finished; it is now marked so its settle rings the doorbell."""


PENDING = Pending()


def outcome(job_id: str, reply: list[Any]) -> Any:
    """Turn ``await.lua``'s reply into the result, or raise JobFailed / JobNotFound.

    Returns :data:`PENDING` when the job is still to finish.
    """
    fields = [x.decode() if isinstance(x, bytes) else x for x in reply]
    state = fields[0]
    if state == "pending":
        return PENDING
    if state == "completed":
        return decode_result(fields[1])
    if state == "dead":
        raise JobFailed(job_id, fields[2])
    if state == "cancelled":
        raise JobFailed(job_id, fields[2] or "the job was cancelled")
    if state == "missing":
        return finished_without_record(job_id, fields[1])
    raise ValueError(f"await.lua answered {reply!r}")


def finished_without_record(job_id: str, token: str) -> Any:
    """A doorbell token for a job whose hash is gone (retention drops completed jobs at once)."""
    if token == "c":
        return None  # completed; its result was not kept (keep_completed=0)
    if token == "d":
        raise JobFailed(job_id, "(the dead job's record is gone)")
    raise JobNotFound(f"no job {job_id!r} (never admitted, or dropped by retention)")


def decode_result(text: str) -> Any:
    """A stored result as the handler returned it (JSON), or the raw text if not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or too deep to decode: the text
        return text


def check_timeout(timeout: float | None) -> float | None:
    """A valid wait in seconds (negative counts as 0) or None; ValueError otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
        raise ValueError(f"timeout must be a number of seconds or None, got {timeout!r}")
    return max(0.0, float(timeout))


def block_args(key: str, remaining: float | None) -> tuple[list[Any], float]:
    """The BLMOVE command and the client-side read timeout for one park."""
    if remaining is None:
        server, client = SLICE_S, SLICE_S + SERVER_GRACE_S
    else:
        server, client = remaining + SERVER_GRACE_S, remaining
    return ["BLMOVE", key, key, "LEFT", "LEFT", round(server, 3)], client


def timed_out(job_id: str, timeout: float | None) -> TimeoutError:
    """The `TimeoutError` raised when a job did not finish within ``timeout``."""
    return TimeoutError(f"job {job_id!r} did not finish within {timeout} s")


def waiter_pool(client: redis.Redis) -> redis.ConnectionPool:
    """A pool to the same server for parked waiters, apart from the command pool."""
    pool = client.connection_pool
    return forksafe.track(redis.ConnectionPool(connection_class=pool.connection_class,
                                               max_connections=WAITERS_MAX,
                                               **_connection_kwargs(pool)))


def _connection_kwargs(pool: Any) -> dict[str, Any]:
    # a pool's own per-pool helpers must not be shared with another pool
    return {k: v for k, v in pool.connection_kwargs.items()
            if not k.startswith(("maint_notifications_pool", "orig_"))}


def wait(waiters: redis.ConnectionPool, keys: Keys, job_id: str,
         timeout: float | None) -> Any:
    """Block until the job finishes (see the module docstring); the sync waiter.

    The whole wait runs on one connection of ``waiters``: the check, the park and
    the read after the wake-up.
    """
    validate_job_id(job_id)
    timeout = check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    doorbell = keys.done(job_id)
    conn: Any = waiters.get_connection()
    try:
        while True:
            mark = deadline is None or deadline > time.monotonic()
            result = outcome(job_id, _await(conn, scripts.await_keys(keys, job_id), mark))
            if result is not PENDING:
                return result
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise timed_out(job_id, timeout)
            if not _park(conn, doorbell, remaining) and deadline is not None:
                # one last read: a token that expired before this waiter parked (a process
                # paused between marking and parking) must not hide a finished job
                last = outcome(job_id, _await(conn, scripts.await_keys(keys, job_id), False))
                if last is not PENDING:
                    return last
                raise timed_out(job_id, timeout)
    except (JobFailed, JobNotFound, TimeoutError):
        raise  # answers read in full: the connection is clean
    except BaseException:
        conn.disconnect()  # a reply may still be due: never hand this connection on
        raise
    finally:
        waiters.release(conn)


def _await(conn: Any, keys: list[str], mark: bool) -> Any:
    script = scripts.AWAIT
    command = ["EVALSHA", script.sha, script.num_keys, *keys, "1" if mark else "0"]
    conn.send_command(*command)
    try:
        return conn.read_response()
    except redis.exceptions.NoScriptError:
        conn.send_command("SCRIPT", "LOAD", script.source)
        conn.read_response()
        conn.send_command(*command)
        return conn.read_response()


def _park(conn: Any, key: str, remaining: float | None) -> bool:
    """One BLMOVE; True when a token came, False on the deadline (the socket is dropped)."""
    command, read_timeout = block_args(key, remaining)
    conn.send_command(*command)
    try:
        reply = conn.read_response(timeout=read_timeout)
    except redis.exceptions.TimeoutError:
        conn.disconnect()  # the call is still parked on the server: drop it with the socket
        return False
    return reply is not None
