"""The concurrent drain's asyncio client, made from the consumer's sync client."""

from __future__ import annotations

import asyncio

import pytest

from echomq.concurrent import async_twin
from echomq.connection import client_from_url


@pytest.mark.xfail(strict=True, reason=(
    "async_twin copies parser_class=RefusalParser (a sync parser) into the asyncio pool; "
    "redis-py 8 refuses to build the connection (RedisError 'Maintenance notifications are "
    "only supported with hiredis and RESP3 parsers!'), so every concurrent or async "
    "consumer's round trip fails and it never claims"))
def test_async_twin_of_a_client_from_url_runs_a_command(redis_url: str) -> None:
    client = client_from_url(redis_url)

    async def ping() -> bool:
        twin = async_twin(client)
        try:
            return bool(await twin.ping())
        finally:
            await twin.aclose()

    assert asyncio.run(ping()) is True
