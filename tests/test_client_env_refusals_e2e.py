"""PoolingClient reads the NATS variables the CLI reads, and `poolwire stats` / `poolwire
events` fail at once on a subject their user may not use (as PoolingClient does), against a
nats-server with users and permissions."""

import asyncio
import sys
import time

import pytest

from poolwire.actors.nats_server import NatsServer
from poolwire.client import PoolingClient, environment_options
from poolwire.nats_connect import NatsConnectError

pytestmark = [pytest.mark.timeout(90)]

PASSWORD = "pw-env-3x9"
CONF = """
authorization {{
  users: [
    {{ user: alice, password: "{pw}" }}
    {{ user: nobody, password: "{pw}",
       permissions: {{ publish: ["other.>"], subscribe: ["_INBOX.>"] }} }}
  ]
}}
"""


@pytest.fixture(scope="module")
def users_server(tmp_path_factory):
    conf = tmp_path_factory.mktemp("users") / "nats.conf"
    conf.write_text(CONF.format(pw=PASSWORD))
    with NatsServer(config=conf, jetstream=False) as server:
        yield server


def test_variables_fill_only_the_options_not_given(monkeypatch):
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("NATS_USER", "alice")
    monkeypatch.setenv("NATS_PASSWORD", "from-env")
    monkeypatch.setenv("NATS_CREDS", "/nonexistent.creds")
    monkeypatch.setenv("POOLWIRE_NATS_INBOX_PREFIX", "_INBOX.alice")
    url, options = environment_options({"password": "given", "creds": None})
    assert url == "nats://127.0.0.1:1"
    assert options == {"user": "alice", "password": "given", "creds": "/nonexistent.creds",
                       "inbox_prefix": "_INBOX.alice"}


async def test_the_client_takes_user_and_password_from_the_environment(users_server, monkeypatch):
    host_port = users_server.url.removeprefix("nats://")
    monkeypatch.setenv("NATS_URL", users_server.url)
    monkeypatch.setenv("NATS_USER", "alice")
    monkeypatch.setenv("NATS_PASSWORD", PASSWORD)
    async with PoolingClient() as client:  # no URL, no options: all from the variables
        assert client.nc.is_connected
    # Not read when asked not to: the server refuses the connection without credentials.
    with pytest.raises(NatsConnectError):
        async with PoolingClient(f"nats://{host_port}", use_env=False, connect_timeout_s=2):
            pass


async def run_cli(*args: str) -> tuple[int, float, str]:
    started = time.monotonic()  # reported, not asserted
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, time.monotonic() - started, err.decode()


@pytest.mark.parametrize("command", [["stats"], ["events", "--timeout", "30"]])
async def test_operators_commands_fail_at_once_on_a_refused_subject(users_server, command):
    # `nobody` may publish only to other.> and subscribe only to _INBOX.>: STATS cannot be
    # asked, events cannot be followed. Each fails in one line, exit 3 (without the refusal
    # seen, stats would say "no worker answered", exit 1, and events would end at its
    # --timeout with exit 0).
    code, took, err = await run_cli(*command, "--nats-url", users_server.url, "--prefix", "sec",
                                    "--nats-user", "nobody", "--nats-password", PASSWORD)
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "permissions violation" in lines[0], err
    assert ("$SRV.STATS.poolwire" if command[0] == "stats" else "sec.events.deprecation") \
        in lines[0]
