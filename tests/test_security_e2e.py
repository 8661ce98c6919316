"""Secured NATS: nats-servers with users and permissions (passwords, NKeys: the deployment's own
deploy/nats/nats-server.conf), a token, and mutual TLS with certificates made here. A worker
with the right credentials serves; wrong ones fail at start with one line; permissions keep
publishers to their subjects and their own replies; no credential leaks into logs, discovery,
stats or events."""

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgpack
import nats.errors
import nkeys
import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.actors.worker import Worker
from poolwire.client import PoolingClient
from poolwire.nats_connect import NatsConnectError, NatsOptions, close_quietly, connect
from poolwire.settings import WorkerSettings

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "pw-Xq7-never-printed"
TOKEN = "tok-Zr4-never-printed"

PASSWORD_CONF = """
WORKER = {{
  publish: {{ allow: ["sec.events.>", "sec.probe.>", "$JS.API.>"] }}
  subscribe: {{ allow: ["sec.>", "$SRV.>", "_INBOX.worker.>"] }}
  allow_responses: {{ max: 1000000, expires: "10m" }}
}}
authorization {{
  users: [
    {{ user: worker, password: "{pw}", permissions: $WORKER }}
    {{ user: alice, password: "{pw}",
       permissions: {{ publish: ["sec.*"], subscribe: ["_INBOX.alice.>"] }} }}
    {{ user: bob, password: "{pw}",
       permissions: {{ publish: ["sec.*"], subscribe: ["_INBOX.bob.>"] }} }}
    {{ user: nobody, password: "{pw}",
       permissions: {{ publish: ["other.>"], subscribe: ["_INBOX.>"] }} }}
    {{ user: operator, password: "{pw}" }}
  ]
}}
"""


@contextlib.asynccontextmanager
async def serving(model, url: str, prefix: str, client_options: dict, **settings):
    """A worker in this process, answering a request from a client with `client_options`."""
    worker = Worker(WorkerSettings(prefix=prefix, probe_interval_s=0.5, **settings), model)
    await worker.start(url)
    try:
        async with PoolingClient(url, prefix=prefix, timeout=60, **client_options) as client:
            reply = await client.embed(["hello"])
            assert len(reply["data"][0]["data"]) == 384
        yield worker
    finally:
        await worker.stop()


def server_errors() -> tuple[list[str], dict]:
    """An error_cb that keeps the server's -ERR texts, for permission violations."""
    seen: list[str] = []

    async def error_cb(exc):
        seen.append(str(exc))
    return seen, {"error_cb": error_cb}


@pytest.fixture(scope="module")
def password_server(tmp_path_factory):
    conf = tmp_path_factory.mktemp("pw") / "nats.conf"
    conf.write_text(PASSWORD_CONF.format(pw=PASSWORD))
    with NatsServer(config=conf) as server:
        yield server


async def test_users_and_permissions(password_server, minilm, caplog, report):
    url = password_server.url
    caplog.set_level(logging.DEBUG)
    worker_auth = {"nats_user": "worker", "nats_password": PASSWORD,
                   "nats_inbox_prefix": "_INBOX.worker"}
    alice = {"user": "alice", "password": PASSWORD, "inbox_prefix": "_INBOX.alice"}
    async with serving(minilm, url, "sec", alice, multitask="warn", **worker_auth) as worker:
        # A publisher without permission for sec.<task>: the server refuses the publish.
        seen, cbs = server_errors()
        nc = await nats.connect(url, user="nobody", password=PASSWORD, **cbs)
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request("sec.embed", msgpack.packb({"input": "x"}), timeout=1.0)
            assert any("permissions violation for publish to \"sec.embed\"" in e.lower()
                       for e in seen), seen
        finally:
            await nc.close()
        # A publisher cannot read another client's replies, nor the requests themselves.
        seen, cbs = server_errors()
        bob = await nats.connect(url, user="bob", password=PASSWORD, **cbs)
        try:
            spy = await bob.subscribe("_INBOX.alice.>")
            requests_spy = await bob.subscribe("sec.>")
            await bob.flush()
            async with PoolingClient(url, prefix="sec", **alice) as client:
                assert len((await client.embed(["for alice only"]))["data"]) == 1
            with pytest.raises(nats.errors.TimeoutError):
                await spy.next_msg(timeout=0.5)
            with pytest.raises(nats.errors.TimeoutError):
                await requests_spy.next_msg(timeout=0.1)
            text = " ".join(seen).lower()
            assert "permissions violation for subscription to \"_inbox.alice.>\"" in text, seen
            assert "permissions violation for subscription to \"sec.>\"" in text, seen
        finally:
            await bob.close()
        # No credential in discovery, stats, events or logs.
        op = await nats.connect(url, user="operator", password=PASSWORD)
        try:
            events = await op.subscribe("sec.events.>")
            async with PoolingClient(url, prefix="sec", **alice) as client:
                await client.request("token_embed", {"input": "deprecated task"})
            event = await events.next_msg(timeout=10)
            info = await op.request(f"$SRV.INFO.poolwire.{worker.discovery.id}", b"", timeout=5)
            stats = await op.request(f"$SRV.STATS.poolwire.{worker.discovery.id}", b"", timeout=5)
        finally:
            await op.close()
    exposed = [event.data.decode(errors="replace"), info.data.decode(), stats.data.decode(),
               caplog.text, repr(worker.settings)]
    assert json.loads(info.data)["metadata"]["worker"] == worker.worker_id
    assert all(PASSWORD not in text for text in exposed)
    report("users and permissions", publish_refused=True, foreign_inbox_refused=True,
           leaks=0)


async def test_wrong_credentials_fail_at_start_with_one_line(password_server, minilm, report):
    worker = Worker(WorkerSettings(prefix="sec", nats_user="worker",
                                   nats_password="wrong-" + PASSWORD,
                                   nats_connect_timeout_s=10), minilm)
    start = asyncio.get_running_loop().time()
    with pytest.raises(NatsConnectError) as info:
        await worker.start(password_server.url)
    took = asyncio.get_running_loop().time() - start
    message = str(info.value)
    assert "\n" not in message and PASSWORD not in message
    assert "refused the credentials" in message and "--nats-password / NATS_PASSWORD" in message
    assert took < 10  # refused credentials do not wait out the connect timeout
    report("wrong password at start", failed_after_s=round(took, 3))
    # The client CLI says the same in one line, exit 3.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", "embed", "hi", "--nats-url", password_server.url,
        "--prefix", "sec", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "NATS_USER": "alice", "NATS_PASSWORD": "nope"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 3 and out == b""
    assert err.decode().count("\n") == 1 and "refused the credentials" in err.decode()


def nkey_user(path: Path) -> str:
    """Write a fresh user NKey seed to `path`; return its public key."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path.write_bytes(seed + b"\n")
    return nkeys.from_seed(bytearray(seed)).public_key.decode()


async def test_the_deployment_config_with_nkeys(minilm, tmp_path, caplog, report):
    """deploy/nats/nats-server.conf as compose runs it: NKey users, public keys from the
    environment, seeds in files. The worker's permissions are enough for all it does: the
    events stream (JetStream API), streamed replies of many frames, its self-check."""
    caplog.set_level(logging.INFO)
    made = subprocess.run([sys.executable, str(ROOT / "deploy/nats/make_nkeys.py"), str(tmp_path)],
                          capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in made.stdout.split())
    assert set(env) == {"POOLWIRE_WORKER_NKEY", "POOLWIRE_PUBLISHER_NKEY"}
    assert (tmp_path / "worker.nk").stat().st_mode & 0o077 == 0  # the seed is the owner's only
    nkey_user(tmp_path / "stranger.nk")
    with NatsServer(store_dir=tmp_path / "nats", config=ROOT / "deploy/nats/nats-server.conf",
                    env=env) as server:
        publisher = {"nkey": tmp_path / "publisher.nk", "inbox_prefix": "_INBOX.publisher"}
        async with serving(minilm, server.url, "pooling", publisher,
                           nats_nkey=tmp_path / "worker.nk", nats_inbox_prefix="_INBOX.worker") as worker:
            assert "created stream POOLWIRE_EVENTS_POOLING" in caplog.text
            async with PoolingClient(server.url, prefix="pooling", timeout=60, **publisher) as client:
                frames = [f async for f in client.stream("embed", {"input": ["a", "b", "c"]})]
            assert len(frames) == 4 and frames[-1]["done"]
            assert worker.watchdog.last.healthy, worker.watchdog.last
            seen, cbs = server_errors()
            nc = await connect(NatsOptions.from_values(server.url, **publisher))
            nc._error_cb = cbs["error_cb"]  # to see the server's permission errors
            try:
                await nc.subscribe("_INBOX.worker.>")
                await nc.publish("pooling.probe.fake", b"x")
                await nc.flush()
                await nc.request("$SRV.PING", b"", timeout=0.5)
            except nats.errors.TimeoutError:
                pass
            finally:
                await close_quietly(nc)
            text = " ".join(seen).lower()
            assert "subscription to \"_inbox.worker.>\"" in text, seen
            assert "publish to \"pooling.probe.fake\"" in text, seen
        with pytest.raises(NatsConnectError, match="refused the credentials"):
            await connect(NatsOptions.from_values(server.url, nkey=tmp_path / "stranger.nk"))
    report("deployment config, NKeys", served=True, stranger_refused=True)


async def test_token(minilm, tmp_path):
    conf = tmp_path / "nats.conf"
    conf.write_text(f'authorization {{ token: "{TOKEN}" }}\n')
    with NatsServer(store_dir=tmp_path / "nats", config=conf) as server:
        async with serving(minilm, server.url, "tok", {"token": TOKEN}, nats_token=TOKEN):
            pass
        with pytest.raises(NatsConnectError, match="refused the credentials") as info:
            await connect(NatsOptions.from_values(server.url, token="wrong"))
        # A token given in the URL works too, and is never shown.
        host = server.url.removeprefix("nats://")
        nc = await connect(NatsOptions.from_values(f"nats://{TOKEN}@{host}"))
        await close_quietly(nc)
        assert TOKEN not in str(info.value)


def make_certificates(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, cert, key):
        (d / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{stem}-key.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("poolwire test CA")).issuer_name(name("poolwire test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca, ca_key)

    def leaf(stem, cn, usage, san):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        write(stem, builder.sign(ca_key, hashes.SHA256()), key)

    leaf("server", "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH,
         [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    leaf("client", "poolwire worker", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    return {p.stem: p for p in d.glob("*.pem")}


async def test_mutual_tls(minilm, tmp_path, report):
    certs = make_certificates(tmp_path)
    conf = tmp_path / "nats.conf"
    conf.write_text(f"""tls {{
  cert_file: "{certs['server']}"
  key_file: "{certs['server-key']}"
  ca_file: "{certs['ca']}"
  verify: true
}}
""")
    tls = {"ca": certs["ca"], "cert": certs["client"], "key": certs["client-key"]}
    with NatsServer(store_dir=tmp_path / "nats", config=conf) as server:
        url = server.url.replace("nats://", "tls://")
        async with serving(minilm, url, "tls", tls, nats_ca=tls["ca"], nats_cert=tls["cert"],
                           nats_key=tls["key"]):
            pass
        # Without the CA the server's certificate cannot be verified; without a client
        # certificate the server refuses us. Each fails in one line.
        with pytest.raises(NatsConnectError, match="TLS failed; check --nats-ca"):
            await connect(NatsOptions.from_values(url, connect_timeout_s=5))
        with pytest.raises(NatsConnectError) as info:
            await connect(NatsOptions.from_values(url, ca=certs["ca"], connect_timeout_s=2))
        assert "\n" not in str(info.value)
    report("mutual TLS", served=True, without_ca_refused=True, without_client_cert_refused=True)


async def test_credentials_revoked_while_serving_end_the_worker(minilm, tmp_path, report):
    """The operator removes the worker's user and reloads nats-server: the server closes the
    connection, and every reconnect is refused with 'Authorization Violation'. The worker reports
    it as failed (poolwire serve then exits 4, and its restart fails at start in one line, exit
    3) instead of running on, reconnecting forever."""
    conf = tmp_path / "nats.conf"
    users = '{{ user: worker, password: "{pw}" }}, {{ user: alice, password: "{pw}" }}'
    conf.write_text(f"authorization {{ users: [ {users.format(pw=PASSWORD)} ] }}\n")
    with NatsServer(store_dir=tmp_path / "nats", config=conf, jetstream=False) as server:
        alice = {"user": "alice", "password": PASSWORD}
        async with serving(minilm, server.url, "rev", alice, nats_user="worker",
                           nats_password=PASSWORD) as worker:
            conf.write_text(f'authorization {{ users: [ {{ user: alice, password: "{PASSWORD}" }} ] }}\n')
            revoked = asyncio.get_running_loop().time()
            os.kill(server._proc.pid, signal.SIGHUP)  # nats-server reloads its config
            reason = await asyncio.wait_for(asyncio.shield(worker.failed), 10)
            took = asyncio.get_running_loop().time() - revoked
            assert "refused the credentials on reconnecting" in reason and PASSWORD not in reason
            assert "--nats-password / NATS_PASSWORD" in reason
            report("credentials revoked while serving", failed_after_s=round(took, 3))
