"""Failures inside a worker: a forward pass that raises and an actor that crashes are
answered with `internal` errors, and the worker keeps serving."""

import asyncio

import msgpack
import pytest

import poolwire.actors.engine
import poolwire.actors.validator
from poolwire.client import PoolingClient, PoolingServiceError

pytestmark = [pytest.mark.timeout(120), pytest.mark.chaos]


async def test_a_failing_forward_pass_answers_its_batch_with_internal(minilm, start_worker, nc, prefix, monkeypatch):
    real = poolwire.actors.engine.run_batch
    calls = []

    def flaky(backend, seqs, specs):
        calls.append(len(seqs))
        if len(calls) == 1:
            raise RuntimeError("simulated device fault")
        return real(backend, seqs, specs)

    monkeypatch.setattr(poolwire.actors.engine, "run_batch", flaky)
    async with start_worker(minilm):
        client = PoolingClient(nc, prefix=prefix)
        with pytest.raises(PoolingServiceError) as info:
            await client.embed(["first", "batch"])
        assert info.value.code == "internal" and "simulated device fault" in info.value.error["message"]
        reply = await client.embed(["served", "after"])
    assert len(reply["data"]) == 2


async def test_a_crashing_validator_answers_internal_and_carries_on(minilm, start_worker, nc, prefix, monkeypatch):
    real = poolwire.actors.validator.parse_request
    crashes = []

    def crash_on_marker(task, body):
        if body.get("input") == "crash me":
            crashes.append(1)
            raise KeyError("simulated bug")
        return real(task, body)

    monkeypatch.setattr(poolwire.actors.validator, "parse_request", crash_on_marker)
    async with start_worker(minilm) as worker:
        client = PoolingClient(nc, prefix=prefix)
        results = await asyncio.gather(*(client.embed("crash me") for _ in range(3)),
                                       client.embed("fine"), return_exceptions=True)
        assert [r.code for r in results[:3]] == ["internal"] * 3
        assert len(results[3]["data"]) == 1
        # Each crash is that request's failure, not the actor's: no restart, no restart delay.
        assert worker.validator.failures == 3 and worker.supervisor.restarts == {}
        # A request without a reply subject is computed and dropped without harm.
        await nc.publish(f"{prefix}.embed", msgpack.packb({"input": "no reply subject"}))
        assert len((await client.embed("still fine"))["data"]) == 1
    assert len(crashes) == 3
