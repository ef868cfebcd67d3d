"""The concurrent drain's asyncio client, made from the consumer's sync client."""

from __future__ import annotations

import asyncio

from echomq.asynctwin import async_twin
from echomq.connection import client_from_url


def test_async_twin_of_a_client_from_url_runs_a_command(redis_url: str) -> None:
    client = client_from_url(redis_url)

    async def ping() -> bool:
        twin = async_twin(client)
        try:
            return bool(await twin.ping())
        finally:
            await twin.aclose()

    assert asyncio.run(ping()) is True
