"""The wire protocol's version (docs/protocol.md), recorded in each queue's meta.

The version is ``MAJOR.MINOR``. A client of another language, or another release,
runs the same scripts on the same keys; MINOR grows when fields or scripts are added
that an older client may ignore, MAJOR when a key, field or script changes meaning.
The first client to use a queue records its version (meta field ``protocol``, set
only when absent); every client reads it at first use and refuses a queue whose
MAJOR differs from its own with :class:`echomq.errors.ProtocolMismatch`.
"""

from __future__ import annotations

from typing import Any

from echomq.errors import ProtocolMismatch
from echomq.keys import Keys

PROTOCOL_VERSION = "1.3"
FIELD = "protocol"  # the meta field holding it


def major(version: str) -> int | None:
    """The MAJOR part of ``"MAJOR.MINOR"``, None when the text is not a version."""
    head, dot, tail = version.partition(".")
    if not (head.isdigit() and dot and tail.isdigit()) or not head.isascii():
        return None
    return int(head)


def check(queue: str, recorded: bytes | str | None) -> None:
    """Raise ProtocolMismatch unless ``recorded`` (the meta's field; None: not recorded)
    has this client's MAJOR version."""
    if recorded is None:
        return
    text = recorded.decode(errors="replace") if isinstance(recorded, bytes) else recorded
    if major(text) != major(PROTOCOL_VERSION):
        raise ProtocolMismatch(
            f"queue {queue!r} speaks protocol {text!r} (meta field {FIELD!r}), this client "
            f"speaks {PROTOCOL_VERSION}: a different MAJOR version, nothing was admitted. Use a "
            "client of the queue's major version (see docs/protocol.md)")


def claim(client: Any, keys: Keys) -> None:
    """Record this client's version in the queue's meta when none is, then check the
    recorded one (two commands, at a client's first use of a queue)."""
    client.hsetnx(keys.meta, FIELD, PROTOCOL_VERSION)
    check(keys.queue, client.hget(keys.meta, FIELD))


async def aclaim(client: Any, keys: Keys) -> None:
    """:func:`claim` on an asyncio client."""
    await client.hsetnx(keys.meta, FIELD, PROTOCOL_VERSION)
    check(keys.queue, await client.hget(keys.meta, FIELD))
