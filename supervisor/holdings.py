"""A child's leased jobs in shared memory: written by the child, read by the parent.

The parent must know at every moment which jobs each child holds (to extend
their leases and to hand them back when the child dies) and which of them are
running (only those count a stall). A line over the pipe per job would cost a
write per job, so each child gets an anonymous shared mapping, made before the
fork, with one fixed-size entry per job it may hold. The child changes an
entry's state with a one-byte store, written after the entry's other fields;
the parent only reads. A torn read of a live child's entry at worst presents a
wrong token, which the scripts refuse.

The header holds the earliest deadline of a running job the parent must
enforce (a sync handler cannot be interrupted inside its process), so the
parent's loop reads one number per child to know when to look closer.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FREE, HELD, RUNNING, FINISHED = 0, 1, 2, 3
STATE_NAMES = {HELD: "held", RUNNING: "running", FINISHED: "finished"}

# capacity, earliest enforced deadline (monotonic s, 0 none), jobs dropped (settled or handed
# back) so far, mod 2**32
_HEADER = struct.Struct("<IdI")
ID_MAX = 255
TOKEN_MAX = 32
# state, id length, token length, seq, deadline, timeout, id, token
_ENTRY = struct.Struct(f"<BBBQdd{ID_MAX}s{TOKEN_MAX}s")
HEADER_SIZE = 16
ENTRY_SIZE = 320
_TIMES = struct.Struct("<dd")  # an entry's deadline and timeout, at _TIMES_AT
_TIMES_AT = 11
_DROPPED = struct.Struct("<I")
_ASYNC_AT = 314  # an entry's spare byte: 1 while it runs as a coroutine (not in a thread)
assert _ENTRY.size <= ENTRY_SIZE and _HEADER.size <= HEADER_SIZE


@dataclass(frozen=True)
class Held:
    """One job a child holds, as the parent reads it."""

    job_id: str
    token: str
    state: int
    seq: int
    deadline: float
    timeout: float
    in_thread: bool = True  # a sync handler (the process must end to stop it)

    @property
    def pair(self) -> tuple[str, str]:
        """The (job id, lease token) pair the scripts take."""
        return self.job_id, self.token


class Holdings:
    """The shared table of one child. Build it in the parent before forking."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.mem = mmap.mmap(-1, HEADER_SIZE + capacity * ENTRY_SIZE)
        _HEADER.pack_into(self.mem, 0, capacity, 0.0, 0)
        # the child's own bookkeeping (each process has its copy after the fork)
        self._held: dict[str, tuple[int, str]] = {}  # job id -> slot, token it is held under
        self._free = list(range(capacity - 1, -1, -1))
        self._seq = 0
        self._deadlines: dict[int, float] = {}
        self._dropped = 0

    # --- the child's side -----------------------------------------------------------
    # on the hot path of every job (the forked consumer calls each once per job): flat,
    # with the table and the struct's methods looked up once per call

    def hold(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Record newly leased jobs, in claim order."""
        held, free, mem, pack = self._held, self._free, self.mem, _ENTRY.pack_into
        for job_id, token in pairs:
            if job_id in held:
                self.drop([job_id])
            if not free:
                raise RuntimeError(f"more than {self.capacity} jobs held at once")
            slot = free.pop()
            held[job_id] = slot, token
            self._seq += 1
            raw_id, raw_token = job_id.encode(), token.encode()
            base = HEADER_SIZE + slot * ENTRY_SIZE
            # struct's "s" cuts a longer value to its size; the length fields are cut alike
            pack(mem, base, FREE, min(len(raw_id), ID_MAX), min(len(raw_token), TOKEN_MAX),
                 self._seq, 0.0, 0.0, raw_id, raw_token)
            mem[base + _ASYNC_AT] = 0
            mem[base] = HELD  # last: the entry is complete before it counts

    def start(self, job_id: str, deadline: float = 0.0, timeout: float = 0.0,
              in_thread: bool = True) -> None:
        """A held job starts running; ``deadline`` (monotonic) is for the parent to enforce;
        ``in_thread`` False: a coroutine, which a cancel stops inside the process."""
        entry = self._held.get(job_id)
        if entry is None:
            return
        base = HEADER_SIZE + entry[0] * ENTRY_SIZE
        self.mem[base + _ASYNC_AT] = 0 if in_thread else 1
        if not deadline:
            self.mem[base] = RUNNING
            return
        _TIMES.pack_into(self.mem, base + _TIMES_AT, deadline, timeout)
        self.mem[base] = RUNNING
        self._deadlines[entry[0]] = deadline
        self._write_deadline()

    def finish(self, job_id: str) -> None:
        """A job's handler returned; its outcome is not settled yet."""
        entry = self._held.get(job_id)
        if entry is None:
            return
        self.mem[HEADER_SIZE + entry[0] * ENTRY_SIZE] = FINISHED
        if self._deadlines and self._deadlines.pop(entry[0], None) is not None:
            self._write_deadline()

    def drop_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Jobs settled or handed back, each with the token it was claimed with: a job
        held again under a newer token (its old lease was reaped and it was claimed
        again) stays held."""
        held = self._held
        self.drop([job_id for job_id, token in pairs
                   if (entry := held.get(job_id)) is not None and entry[1] == token])

    def drop(self, job_ids: Iterable[str]) -> None:
        """Jobs settled or handed back: no longer held."""
        held, free, mem, deadlines = self._held, self._free, self.mem, self._deadlines
        changed = False
        for job_id in job_ids:
            entry = held.pop(job_id, None)
            if entry is None:
                continue
            slot = entry[0]
            mem[HEADER_SIZE + slot * ENTRY_SIZE] = FREE
            free.append(slot)
            self._dropped += 1
            if deadlines and deadlines.pop(slot, None) is not None:
                changed = True
        _DROPPED.pack_into(mem, 12, self._dropped & 0xFFFFFFFF)
        if changed:
            self._write_deadline()

    def _write_deadline(self) -> None:
        earliest = min(self._deadlines.values()) if self._deadlines else 0.0
        struct.pack_into("<d", self.mem, 4, earliest)

    # --- the parent's side ----------------------------------------------------------

    def deadline(self) -> float:
        """The earliest enforced deadline of a running job (monotonic s), 0.0 when none."""
        if self.mem.closed:
            return 0.0
        return float(struct.unpack_from("<d", self.mem, 4)[0])

    def dropped(self) -> int:
        """How many jobs the child has settled or handed back so far (mod 2**32)."""
        if self.mem.closed:
            return 0
        return int(struct.unpack_from("<I", self.mem, 12)[0])

    def entries(self) -> list[Held]:
        """Every job held now, in claim order."""
        out: list[Held] = []
        mem = self.mem
        if mem.closed:
            return out
        for slot in range(self.capacity):
            base = HEADER_SIZE + slot * ENTRY_SIZE
            if mem[base] == FREE:
                continue
            state, id_len, tok_len, seq, deadline, timeout, raw_id, raw_token = (
                _ENTRY.unpack_from(mem, base))
            out.append(Held(raw_id[:id_len].decode("ascii", "replace"),
                            raw_token[:tok_len].decode("ascii", "replace"),
                            state, seq, deadline, timeout, mem[base + _ASYNC_AT] != 1))
        out.sort(key=lambda h: h.seq)
        return out

    def close(self) -> None:
        """Unmap the table (idempotent; in a forked sibling, only its own view goes)."""
        if not self.mem.closed:
            self.mem.close()


def runs_by_mode(held: Sequence[Held], mode_of: dict[int, str]) -> list[tuple[str, list[Held]]]:
    """Split held jobs (claim order) into release calls that put them back in that order.

    The release script pushes each call's jobs onto the head of their lanes so that
    they keep the order given; calls made later go in front. So runs of one mode are
    taken from the end backwards: the last claimed go back first.
    """
    runs: list[tuple[str, list[Held]]] = []
    for h in reversed(held):
        mode = mode_of[h.state]
        if runs and runs[-1][0] == mode:
            runs[-1][1].insert(0, h)
        else:
            runs.append((mode, [h]))
    return runs
