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
        self._slots: dict[str, int] = {}
        self._tokens: dict[str, str] = {}  # job id -> the token it is held under
        self._free = list(range(capacity - 1, -1, -1))
        self._seq = 0
        self._deadlines: dict[int, float] = {}
        self._dropped = 0

    # --- the child's side -----------------------------------------------------------

    def hold(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Record newly leased jobs, in claim order."""
        for job_id, token in pairs:
            if job_id in self._slots:
                self.drop([job_id])
            if not self._free:
                raise RuntimeError(f"more than {self.capacity} jobs held at once")
            slot = self._free.pop()
            self._slots[job_id] = slot
            self._tokens[job_id] = token
            self._seq += 1
            raw_id, raw_token = job_id.encode()[:ID_MAX], token.encode()[:TOKEN_MAX]
            base = HEADER_SIZE + slot * ENTRY_SIZE
            _ENTRY.pack_into(self.mem, base, FREE, len(raw_id), len(raw_token), self._seq,
                             0.0, 0.0, raw_id, raw_token)
            self.mem[base] = HELD  # last: the entry is complete before it counts

    def start(self, job_id: str, deadline: float = 0.0, timeout: float = 0.0) -> None:
        """A held job starts running; ``deadline`` (monotonic) is for the parent to enforce."""
        slot = self._slots.get(job_id)
        if slot is None:
            return
        base = HEADER_SIZE + slot * ENTRY_SIZE
        if not deadline:
            self.mem[base] = RUNNING
            return
        struct.pack_into("<dd", self.mem, base + 11, deadline, timeout)
        self.mem[base] = RUNNING
        self._deadlines[slot] = deadline
        self._write_deadline()

    def finish(self, job_id: str) -> None:
        """A job's handler returned; its outcome is not settled yet."""
        slot = self._slots.get(job_id)
        if slot is None:
            return
        self.mem[HEADER_SIZE + slot * ENTRY_SIZE] = FINISHED
        if self._deadlines.pop(slot, None) is not None:
            self._write_deadline()

    def drop_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Jobs settled or handed back, each with the token it was claimed with: a job
        held again under a newer token (its old lease was reaped and it was claimed
        again) stays held."""
        self.drop(job_id for job_id, token in pairs if self._tokens.get(job_id) == token)

    def drop(self, job_ids: Iterable[str]) -> None:
        """Jobs settled or handed back: no longer held."""
        changed = False
        for job_id in job_ids:
            slot = self._slots.pop(job_id, None)
            if slot is None:
                continue
            self._tokens.pop(job_id, None)
            self.mem[HEADER_SIZE + slot * ENTRY_SIZE] = FREE
            self._free.append(slot)
            self._dropped += 1
            changed |= self._deadlines.pop(slot, None) is not None
        struct.pack_into("<I", self.mem, 12, self._dropped & 0xFFFFFFFF)
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
                            state, seq, deadline, timeout))
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
