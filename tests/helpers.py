"""Helpers shared by the NATS tests."""

import asyncio

import nats


async def wait_until_answering(url: str, prefix: str, timeout: float = 10.0) -> None:
    """Wait until another connection gets an answer from the worker. Right after the worker's
    SUB is flushed, nats-server 2.15 has been seen to answer a first request from another
    connection with no-responders (about 1 start in 15 here, when a JetStream stream was created
    just before); a request an instant later is delivered."""
    conn = await nats.connect(url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await conn.request(f"{prefix}.embed", b"", timeout=timeout)  # an error reply
                return
            except nats.errors.NoRespondersError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.01)
    finally:
        await conn.close()
