"""Commands packed for a connection's ``send_packed_command``, sync or asyncio: by hiredis
at once where redis-py would pack with hiredis, without redis-py's per-argument encoding
and type checks (a fifth of a one-by-one add's client time). The bytes are redis-py's own:
a client made with another ``encoding`` than UTF-8 (strict), or an argument hiredis
refuses (an ``int`` subclass, a bool), keeps redis-py's packer, so every call of a client
encodes alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

try:
    from hiredis import pack_command as _hiredis_pack
    from redis.connection import HiredisRespSerializer
except ImportError:  # redis-py packs in Python then
    _hiredis_pack = None

if TYPE_CHECKING:
    from echomq.scripts import Arg, LuaScript


def pack_commands(conn: Any, commands: Sequence[tuple[Arg, ...]]) -> Any:
    """``commands`` packed for ``conn.send_packed_command``."""
    if _hiredis_pack is not None and \
            isinstance(getattr(conn, "_command_packer", None), HiredisRespSerializer):
        encoder = conn.encoder
        if encoder.encoding in ("utf-8", "utf8") and encoder.encoding_errors == "strict":
            try:
                return [b"".join(map(_hiredis_pack, commands))]
            except TypeError:
                pass  # redis-py's encoder sends it as before, or raises its DataError
    return conn.pack_commands(commands)


def pack_calls(conn: Any, calls: Sequence[tuple[LuaScript, Sequence[str], Sequence[Arg]]]
               ) -> Any:
    """Script calls as EVALSHA commands packed for ``conn.send_packed_command``."""
    return pack_commands(conn, [("EVALSHA", script.sha, script.num_keys, *keys, *args)
                                for script, keys, args in calls])
