"""Credentials files against a nats-server in operator mode (decentralised JWT auth): an
operator, a system account and an application account with JetStream, and users with
permissions in their JWTs, all made here (tests/nats_jwt.py) and preloaded into the server's
MEMORY resolver. A worker with a creds file serves a client with another user's creds file;
the JWT's permissions are enforced and reported at once; expired or foreign creds fail at start
in one line, exit 3; no seed or JWT leaks into logs, discovery, stats or events."""

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.actors.worker import Worker
from poolwire.cli import main
from poolwire.client import PoolingClient
from poolwire.nats_connect import NatsConnectError, NatsOptions, close_quietly, connect
from poolwire.refusals import PermissionRefusedError
from poolwire.settings import WorkerSettings
from tests import nats_jwt as jwt

pytestmark = [pytest.mark.timeout(60)]

PREFIX = "jwt"
# Workers here take a padding budget as given: measuring it (seconds of forward passes) is not
# what these tests are about.


@dataclass
class OperatorMode:
    url: str
    creds: dict[str, Path]      # user name -> credentials file
    secrets: list[str]          # the seed, JWT and signature in each application user's file


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory):
    d = tmp_path_factory.mktemp("operator")
    operator, system, app = jwt.operator_key(), jwt.account_key(), jwt.account_key()
    accounts = {system.public: jwt.account_jwt(operator, system, "SYS"),
                app.public: jwt.account_jwt(operator, app, "APP", jetstream=True)}
    users = {
        # The worker's permissions, as a deployment would give them: requests in, replies
        # out (allow_responses), events and the JetStream API for its events stream, its
        # self-check probes, discovery (answering it, and asking the other workers at start
        # whether they serve the same model), and replies under its own inbox prefix.
        "worker": dict(pub=[f"{PREFIX}.events.>", f"{PREFIX}.probe.>", "$JS.API.>",
                            "$SRV.INFO.poolwire"],
                       sub=[f"{PREFIX}.>", "$SRV.>", "_INBOX.worker.>"], allow_responses=True),
        # A publisher allowed one task, with replies under its own prefix.
        "embedder": dict(pub=[f"{PREFIX}.embed"], sub=["_INBOX.embedder.>"]),
        "admin": {},  # everything: to read discovery and events
        "expired": dict(expires=int(time.time()) - 60),
    }
    creds, secrets = {}, []
    for name, permissions in users.items():
        user = jwt.user_key()
        token = jwt.user_jwt(app, user, name, **permissions)
        creds[name] = jwt.write_creds(d / f"{name}.creds", token, user)
        secrets += [user.seed.decode(), token, token.split(".")[2]]
    # A user of an account whose JWT gives it no JetStream storage.
    no_js, user = jwt.account_key(), jwt.user_key()
    accounts[no_js.public] = jwt.account_jwt(operator, no_js, "NO-JS")
    creds["no-jetstream"] = jwt.write_creds(d / "no-jetstream.creds",
                                            jwt.user_jwt(no_js, user, "no-js"), user)
    # A well-formed creds file signed by an account the operator never issued.
    stranger, foreign = jwt.user_key(), jwt.account_key()
    creds["stranger"] = jwt.write_creds(d / "stranger.creds",
                                        jwt.user_jwt(foreign, stranger, "stranger"), stranger)
    assert jwt.decode_claims(accounts[app.public])["nats"]["limits"]["disk_storage"] == -1
    (d / "nats.conf").write_text(jwt.server_config(jwt.operator_jwt(operator, system.public),
                                                   system.public, accounts))
    with NatsServer(store_dir=d / "nats", config=d / "nats.conf") as server:
        yield OperatorMode(server.url, creds, secrets)


async def run_cli(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("NATS_")})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def test_worker_serves_a_client_with_creds_files_and_leaks_neither(
        operator_mode, minilm, monkeypatch, caplog, report):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("NATS_CREDS", str(operator_mode.creds["worker"]))  # as `poolwire serve` reads it
    settings = WorkerSettings(prefix=PREFIX, nats_inbox_prefix="_INBOX.worker", multitask="warn",
                              probe_interval_s=0.5, max_added_padding=16)
    assert settings.nats_creds == operator_mode.creds["worker"]
    worker = Worker(settings, minilm)
    await worker.start(operator_mode.url)
    try:
        assert f"created stream POOLWIRE_EVENTS_{PREFIX.upper()}" in caplog.text  # JetStream works
        # The CLI as docs/SECURITY.md documents it, with the other user's creds file.
        code, out, err = await run_cli("embed", "hello", "--nats-url", operator_mode.url,
                                       "--prefix", PREFIX, "--nats-creds",
                                       str(operator_mode.creds["embedder"]),
                                       "--nats-inbox-prefix", "_INBOX.embedder")
        assert code == 0, err
        assert len(json.loads(out)["data"][0]["data"]) == 384
        async with PoolingClient(operator_mode.url, prefix=PREFIX, timeout=30,
                                 creds=operator_mode.creds["embedder"],
                                 inbox_prefix="_INBOX.embedder") as client:
            frames = [f async for f in client.stream("embed", {"input": ["a", "b"]})]
        assert len(frames) == 3 and frames[-1]["done"]
        # The worker's self-check probe went through the server under the JWT's permissions.
        # Nothing signals an answered probe: poll its time, under a deadline.
        deadline = asyncio.get_running_loop().time() + 10
        while worker.watchdog.check.last_ok is None:
            assert asyncio.get_running_loop().time() < deadline, worker.watchdog.last
            await asyncio.sleep(0.05)
        assert worker.watchdog.last.healthy, worker.watchdog.last
        admin = await connect(NatsOptions.from_values(operator_mode.url,
                                                      creds=operator_mode.creds["admin"]))
        try:
            events = await admin.subscribe(f"{PREFIX}.events.>")
            async with PoolingClient(admin, prefix=PREFIX) as client:
                await client.request("token_embed", {"input": "deprecated task"})
            event = await events.next_msg(timeout=10)
            info = await admin.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
            stats = await admin.request(f"$SRV.STATS.poolwire.{worker.discovery.id}", b"",
                                        timeout=5)
        finally:
            await close_quietly(admin)
    finally:
        await worker.stop()
    assert json.loads(info.data)["metadata"]["worker"] == worker.worker_id
    exposed = {"event": event.data.decode(errors="replace"), "info": info.data.decode(),
               "stats": stats.data.decode(), "log": caplog.text, "settings": repr(worker.settings),
               "cli": out + err}
    leaks = [(where, secret[:8]) for where, text in exposed.items()
             for secret in operator_mode.secrets if secret in text]
    assert leaks == []
    report("creds files in operator mode", served=True, streamed=True, jetstream=True, leaks=0)


async def test_the_jwt_permissions_are_enforced_and_reported_at_once(operator_mode, minilm, report):
    worker = Worker(WorkerSettings(prefix=PREFIX, multitask="warn", max_added_padding=16,
                                   nats_creds=operator_mode.creds["worker"],
                                   nats_inbox_prefix="_INBOX.worker"), minilm)
    await worker.start(operator_mode.url)
    embedder = {"creds": operator_mode.creds["embedder"], "inbox_prefix": "_INBOX.embedder"}
    try:
        async with PoolingClient(operator_mode.url, prefix=PREFIX, timeout=20, **embedder) as client:
            assert len((await client.embed(["allowed"]))["data"]) == 1
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(PermissionRefusedError) as info:
                await client.classify(["not allowed"])
            publish_refused_s = loop.time() - start
            message = str(info.value)
            assert f"publishing to '{PREFIX}.classify'" in message and "\n" not in message
            assert "--nats-creds / NATS_CREDS" in message
            assert publish_refused_s < 5  # the server's refusal, not the 20 s timeout
            # A durable job (JetStream publish, retried for 10 s on a missing stream) is
            # refused at once too.
            start = loop.time()
            with pytest.raises(PermissionRefusedError, match=f"publishing to '{PREFIX}.jobs.embed'"):
                await client.submit("embed", {"input": ["not allowed"]})
            assert loop.time() - start < 5
            # The connection is still good for what the user may do.
            assert len((await client.embed(["still allowed"]))["data"]) == 1
        # Without its inbox prefix the user may not subscribe to its reply subjects.
        async with PoolingClient(operator_mode.url, prefix=PREFIX, timeout=20,
                                 creds=embedder["creds"]) as client:
            start = loop.time()
            with pytest.raises(PermissionRefusedError, match="--nats-inbox-prefix"):
                await client.embed(["no replies for me"])
            reply_refused_s = loop.time() - start
            assert reply_refused_s < 5
            with pytest.raises(PermissionRefusedError, match="--nats-inbox-prefix"):
                await client.embed(["nor now"])  # every later request, at once
        # The CLI: one line, exit 3, like refused credentials.
        code, out, err = await run_cli("classify", "x", "--nats-url", operator_mode.url,
                                       "--prefix", PREFIX, "--timeout", "20", "--nats-creds",
                                       str(embedder["creds"]), "--nats-inbox-prefix",
                                       "_INBOX.embedder")
        assert (code, out) == (3, "") and err.count("\n") == 1, err
        assert f"publishing to '{PREFIX}.classify'" in err
    finally:
        await worker.stop()
    report("JWT permissions", publish_refused_after_s=round(publish_refused_s, 3),
           reply_subscription_refused_after_s=round(reply_refused_s, 3), cli_exit=code)


@pytest.mark.parametrize("user", ["expired", "stranger"])
async def test_expired_or_foreign_creds_fail_at_start_in_one_line(operator_mode, minilm, user,
                                                                   report):
    creds = operator_mode.creds[user]
    worker = Worker(WorkerSettings(prefix=PREFIX, nats_creds=creds, max_added_padding=16,
                                   nats_connect_timeout_s=10), minilm)
    start = asyncio.get_running_loop().time()
    with pytest.raises(NatsConnectError) as info:
        await worker.start(operator_mode.url)
    took = asyncio.get_running_loop().time() - start
    message = str(info.value)
    assert "\n" not in message and "refused the credentials" in message
    assert "--nats-creds / NATS_CREDS" in message
    assert not any(secret in message for secret in operator_mode.secrets)
    assert took < 10  # refused at once, not after the connect timeout
    report(f"{user} creds at start", failed_after_s=round(took, 3))


def test_poolwire_serve_with_expired_creds_exits_3_in_one_line(operator_mode, tmp_path, capsys):
    """The worker's command as an operator runs it: one error line on stderr, exit 3. In this
    process, where torch and the model's modules are loaded already (a subprocess spent 20 s
    importing and measuring), with a padding budget given so that none is measured."""
    code = main(["serve", "--nats-url", operator_mode.url, "--prefix", PREFIX, "--nats-creds",
                 str(operator_mode.creds["expired"]), "--nats-connect-timeout-s", "10",
                 "--state-dir", str(tmp_path), "--max-added-padding", "16"])
    out, err = capsys.readouterr()
    assert code == 3, err
    errors = [line for line in err.splitlines() if line.startswith("poolwire:")]
    assert len(errors) == 1 and "refused the credentials" in errors[0], err
    assert "--nats-creds / NATS_CREDS" in errors[0] and "Traceback" not in err
    assert not any(secret in out + err for secret in operator_mode.secrets)


async def test_an_account_without_jetstream_serves_and_says_events_are_not_stored(
        operator_mode, minilm, caplog):
    """JetStream is off for an account unless its JWT gives it storage: the worker still
    serves, and says in one line that deprecation events are not stored, and why."""
    caplog.set_level(logging.WARNING)
    worker = Worker(WorkerSettings(prefix=PREFIX, nats_creds=operator_mode.creds["no-jetstream"],
                                   max_added_padding=16), minilm)
    await worker.start(operator_mode.url)
    try:
        async with PoolingClient(operator_mode.url, prefix=PREFIX, timeout=30,
                                 creds=operator_mode.creds["no-jetstream"]) as client:
            assert len((await client.embed(["hello"]))["data"]) == 1
    finally:
        await worker.stop()
    warnings = [r.getMessage() for r in caplog.records if "JetStream" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "JetStream not enabled for account" in warnings[0]
    assert "deprecation events are not stored" in warnings[0]
