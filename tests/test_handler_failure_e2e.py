"""A handler that raises on one request answers that request `internal` and the actor carries
on at once: no supervisor restart, so no restart delay for the requests behind it."""

import asyncio
import time

import msgpack
import pytest

import poolwire.actors.engine as engine_module

pytestmark = pytest.mark.timeout(120)


async def test_fifty_crashing_requests_are_answered_internal_and_the_engine_carries_on(
        minilm, start_worker, nc, prefix, monkeypatch):
    real_plan_task = engine_module.plan_task

    def plan_task(task, request, model, tokenizing, **options):
        if request.input == "explode":  # a bug that only this input reaches
            raise RuntimeError("a bug in planning")
        return real_plan_task(task, request, model, tokenizing, **options)

    monkeypatch.setattr(engine_module, "plan_task", plan_task)
    async with start_worker(minilm) as worker:
        started = time.monotonic()
        replies = await asyncio.gather(*(
            nc.request(f"{prefix}.embed", msgpack.packb({"input": "explode", "request_id": f"x{i}"}),
                       timeout=30) for i in range(50)))
        elapsed = time.monotonic() - started
        frames = [msgpack.unpackb(r.data) for r in replies]
        ordinary = msgpack.unpackb((await nc.request(
            f"{prefix}.embed", msgpack.packb({"input": "fine"}), timeout=30)).data)
        assert worker.engine.failures == 50
        assert worker.supervisor.restarts == {}
    assert [f["request_id"] for f in frames] == [f"x{i}" for i in range(50)]
    assert {f["error"]["code"] for f in frames} == {"internal"}
    assert all("a bug in planning" in f["error"]["message"] for f in frames)
    assert {r.headers["Nats-Service-Error-Code"] for r in replies} == {"500"}
    assert len(ordinary["data"][0]["data"]) == 384
    print(f"50 crashing requests answered in {elapsed:.3f} s")
