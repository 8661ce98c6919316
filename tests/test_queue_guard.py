"""One task per queue group: the decision on its own, then end to end against a real
nats-server (the second worker refuses to start and names the first; the override lets it)."""

import asyncio
import os
import subprocess
import sys

import msgpack
import pytest

from poolwire.actors.queue_guard import (Member, QueueConflictError, conflict_message, conflicts,
                                         member_from_info)
from poolwire.actors.worker import Worker
from poolwire.settings import WorkerSettings

ME = Member(worker="w-me", model="all-MiniLM-L6-v2", configured_task="embed",
            prefix="pooling", queue="poolwire")


def info(worker, model="all-MiniLM-L6-v2", task="embed", prefix="pooling", queue="poolwire",
         with_metadata=True):
    meta = {"model": model, "configured_task": task, "worker": worker}
    if with_metadata:
        meta |= {"prefix": prefix, "queue": queue}
    return {"type": "io.nats.micro.v1.info_response", "name": "poolwire", "id": "abc",
            "metadata": meta, "endpoints": [{"name": "pooling", "subject": f"{prefix}.*",
                                             "queue_group": queue, "metadata": None}]}


def test_a_worker_with_another_task_or_model_in_my_queue_group_conflicts():
    others = [member_from_info(i) for i in (
        info("same"), info("task", task="token_embed"), info("model", model="bge-small"),
        info("other-queue", task="classify", queue="q2"),
        info("other-prefix", model="x", prefix="pooling.bge"))]
    assert [m.worker for m in conflicts(ME, others)] == ["task", "model"]


def test_myself_never_conflicts_and_alone_there_is_nothing_to_refuse():
    assert conflicts(ME, []) == []
    assert conflicts(ME, [Member("w-me", "other", "classify", "pooling", "poolwire")]) == []


def test_older_workers_are_placed_by_their_endpoint_and_other_services_are_ignored():
    old = member_from_info(info("old", task="classify", prefix="p2", queue="q9", with_metadata=False))
    assert (old.prefix, old.queue, old.configured_task) == ("p2", "q9", "classify")
    assert member_from_info({"name": "some-other-service", "metadata": {}}) is None
    assert member_from_info({"name": "poolwire", "metadata": {}}) is None  # nothing to judge by


def test_the_message_names_each_other_worker_and_the_ways_out():
    message = conflict_message(ME, [Member("host-1234", "bge", "embed", "pooling", "poolwire")])
    for part in ("host-1234", "bge", "all-MiniLM-L6-v2", "'poolwire'", "pooling.*", "--prefix",
                 "--queue", "--allow-mixed-queue"):
        assert part in message


@pytest.mark.timeout(120)
async def test_a_second_worker_for_another_task_refuses_to_start_and_names_the_first(
        minilm, start_worker, nats_server, nc, prefix):
    async with start_worker(minilm) as first:
        second = Worker(WorkerSettings(prefix=prefix, task="token_embed", multitask="reject"), minilm)
        with pytest.raises(QueueConflictError) as refused:
            await second.start(nats_server.url)
        assert first.worker_id in str(refused.value) and "task embed" in str(refused.value)
        assert second.nc is None  # it let go of its connection
        # Every embed request still goes to the first worker: none is refused.
        for i in range(10):
            reply = msgpack.unpackb((await nc.request(f"{prefix}.embed", msgpack.packb(
                {"input": f"t{i}"}), timeout=30)).data)
            assert "error" not in reply
        # Another queue group on the same prefix is the operator's own business.
        async with start_worker(minilm, task="token_embed", queue="token-workers"):
            pass
        # So is an explicit override.
        async with start_worker(minilm, task="token_embed", allow_mixed_queue=True) as mixed:
            assert mixed.ingest is not None


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_poolwire_serve_refuses_with_one_line_and_exit_2(minilm, start_worker, nats_server, prefix):
    async with start_worker(minilm) as first:
        env = {**os.environ, "POOLWIRE_PREFIX": prefix, "NATS_URL": nats_server.url}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolwire", "serve", "--task", "token_embed",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(), 150)
    text = err.decode()
    assert proc.returncode == 2, (out, err)
    assert "Traceback" not in text
    refusal = [line for line in text.splitlines() if line.startswith("poolwire: refusing")]
    assert len(refusal) == 1 and first.worker_id in refusal[0] and "--allow-mixed-queue" in refusal[0]
