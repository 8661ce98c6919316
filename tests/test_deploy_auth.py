"""The authenticated deployment in compose.yaml: statically, NATS runs
deploy/nats/nats-server.conf (which nats-server accepts), workers authenticate with an NKey
seed mounted as a secret file, no secret value is written into the compose file, and the
healthcheck asks this container's worker; against a nats-server running that config, durable
jobs work under the NKey users and a publisher cannot take what is not its own."""

import os
import subprocess
import sys
from pathlib import Path

import msgpack
import nats.errors
import pytest
import yaml

import poolwire.actors.engine
from poolwire.actors.durable import stream_name
from poolwire.actors.nats_server import NatsServer, nats_server_binary
from poolwire.actors.worker import Worker
from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.nats_connect import NatsOptions, close_quietly, connect
from poolwire.settings import WorkerSettings
from tests.helpers import poll_until

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
WORKERS = {name: svc for name, svc in COMPOSE["services"].items() if name != "nats"}
SECRET_VARIABLES = ("NATS_PASSWORD", "NATS_TOKEN", "POOLWIRE_NATS_PASSWORD", "POOLWIRE_NATS_TOKEN")


def test_nats_runs_the_auth_config_and_nats_server_accepts_it(tmp_path):
    nats = COMPOSE["services"]["nats"]
    conf = nats["command"][nats["command"].index("-c") + 1]
    assert f"./deploy/nats/nats-server.conf:{conf}:ro" in nats["volumes"]
    made = subprocess.run([sys.executable, str(ROOT / "deploy/nats/make_nkeys.py"), str(tmp_path)],
                          capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in made.stdout.split())
    assert set(env) == set(nats["environment"])  # what the server config reads
    checked = subprocess.run([nats_server_binary(), "-t", "-c", str(ROOT / "deploy/nats/nats-server.conf")],
                             capture_output=True, text=True, env={**os.environ, **env}, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_workers_use_a_mounted_seed_and_no_inline_secret():
    for name, svc in WORKERS.items():
        env = svc["environment"]
        secret = env["NATS_NKEY"].removeprefix("/run/secrets/")
        assert secret in svc["secrets"] and secret in COMPOSE["secrets"], name
        assert COMPOSE["secrets"][secret]["file"].startswith("./secrets/")
        assert not set(env) & set(SECRET_VARIABLES), name
        assert "@" not in env["NATS_URL"], name  # no credentials in the URL either
        assert env["POOLWIRE_NATS_INBOX_PREFIX"] == "_INBOX.worker"


def test_the_healthcheck_asks_this_containers_worker():
    for name, svc in WORKERS.items():
        assert svc["healthcheck"]["test"] == ["CMD", "poolwire", "health"], name
        assert svc["environment"]["POOLWIRE_HEALTH_FILE"].startswith("/tmp/"), name


def make_keys(tmp_path: Path) -> dict[str, str]:
    made = subprocess.run([sys.executable, str(ROOT / "deploy/nats/make_nkeys.py"), str(tmp_path)],
                          capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in made.stdout.split())




@pytest.mark.timeout(120)
async def test_durable_jobs_under_the_deployment_nkeys(minilm, tmp_path, monkeypatch, caplog):
    """A `--durable` worker under the worker NKey and a publisher under the publisher NKey, on
    the deployment's own config: a job answered on the publisher's inbox and acked, a failing
    job dead-lettered to pooling.dead.embed and terminated. The publisher may neither consume
    the jobs stream (subscribe to its subjects, create a consumer on it) nor write a dead
    letter."""
    real = poolwire.actors.engine.run_batch

    def failing_on_poison(backend, seqs, specs):
        if any(list(seq.ids) == poison_ids for seq in seqs):
            raise RuntimeError("simulated device fault on this input")
        return real(backend, seqs, specs)

    poison_ids = minilm.tokenizer("poisonous xylophone")["input_ids"]
    monkeypatch.setattr(poolwire.actors.engine, "run_batch", failing_on_poison)
    worker_auth = {"nkey": tmp_path / "worker.nk", "inbox_prefix": "_INBOX.worker"}
    publisher_auth = {"nkey": tmp_path / "publisher.nk", "inbox_prefix": "_INBOX.publisher"}
    jobs, dead = stream_name("JOBS", "pooling"), stream_name("DEAD", "pooling")
    with NatsServer(store_dir=tmp_path / "nats", config=ROOT / "deploy/nats/nats-server.conf",
                    env=make_keys(tmp_path)) as server:
        # One failure dead-letters a job at once (--durable-max-deliveries 1).
        worker = Worker(WorkerSettings(prefix="pooling", durable=True, durable_ack_wait_s=2.0,
                                       durable_max_deliveries=1, nats_nkey=worker_auth["nkey"],
                                       nats_inbox_prefix="_INBOX.worker"), minilm)
        await worker.start(server.url)
        # The worker's user, to read the streams' state (the publisher may not).
        inspector = await connect(NatsOptions.from_values(server.url, **worker_auth))
        try:
            async with PoolingClient(server.url, prefix="pooling", timeout=60,
                                     **publisher_auth) as client:
                reply = await client.submit("embed", {"input": "hello", "request_id": "job-1"})
                assert reply["request_id"] == "job-1" and len(reply["data"][0]["data"]) == 384
                with pytest.raises(PoolingServiceError) as info:
                    await client.submit("embed", {"input": "poisonous xylophone"})
                assert info.value.code == "internal"
            js = inspector.jetstream()
            await poll_until(lambda: _messages_are(js, jobs, 0))  # acked and terminated
            assert worker.intakes[0].counters()["dead_lettered"] == 1
            assert worker.intakes[0].counters()["completed"] == 1
            assert (await js.stream_info(dead)).state.messages == 1
            # Nothing the worker did was refused (its start-up's queue-group check included).
            assert "permissions violation" not in caplog.text.lower(), caplog.text

            seen: list[str] = []

            async def error_cb(exc):  # the server's permission errors
                seen.append(str(exc))

            thief = await connect(NatsOptions.from_values(server.url, **publisher_auth))
            thief._error_cb = error_cb
            try:
                await thief.subscribe("pooling.jobs.>")
                await thief.publish("pooling.dead.embed", msgpack.packb({"forged": True}))
                with pytest.raises(nats.errors.TimeoutError):
                    await thief.jetstream(timeout=1.0).pull_subscribe(
                        "pooling.jobs.embed", durable="thief", stream=jobs)
            finally:
                await close_quietly(thief)
            text = " ".join(seen).lower()
            assert 'subscription to "pooling.jobs.>"' in text, seen
            assert 'publish to "pooling.dead.embed"' in text, seen
            assert 'publish to "$js.api.consumer' in text, seen
            assert (await js.stream_info(dead)).state.messages == 1
        finally:
            await close_quietly(inspector)
            await worker.stop()


async def _messages_are(js, stream: str, n: int) -> bool:
    return (await js.stream_info(stream)).state.messages == n
