"""poolwire/nats_connect.py alone: cluster URLs, redaction, reconnect jitter, option checks,
and a first connection that fails within its timeout with one line."""

import random
import socket
import time
from dataclasses import dataclass

import pytest
from pydantic import SecretStr

from poolwire.nats_connect import (NatsConnectError, NatsOptions, connect, nats_options,
                                   parse_servers, pick_server, reconnect_delay, redact_url)
from poolwire.settings import WorkerSettings


def test_every_cluster_url_is_accepted_and_bad_ones_are_named():
    assert parse_servers("nats://a:4222, tls://b:4223,c:4224") == [
        "nats://a:4222", "tls://b:4223", "nats://c:4224"]
    with pytest.raises(ValueError, match=r"'http://\*\*\*@h:1' has scheme 'http'"):
        parse_servers("http://u:secret@h:1")
    with pytest.raises(ValueError, match="names no server"):
        parse_servers(" , ")


def test_credentials_in_urls_are_redacted():
    assert redact_url("nats://alice:s3cret@h:4222") == "nats://***@h:4222"
    assert redact_url("nats://tok3n@h:4222,nats://h2:4222") == "nats://***@h:4222,nats://h2:4222"
    assert redact_url("nats://h:4222") == "nats://h:4222"
    assert "s3cret" not in NatsOptions.from_values("nats://alice:s3cret@h:1").display_url


def test_reconnect_waits_are_jittered_within_half_to_one_wait():
    rng = random.Random(0)
    delays = [reconnect_delay(0.25, rng) for _ in range(1000)]
    assert min(delays) >= 0.125 and max(delays) <= 0.25
    assert len({round(d, 3) for d in delays}) > 50  # spread, not lockstep


def test_the_least_tried_server_is_tried_next():
    @dataclass
    class S:
        name: str
        reconnects: int

    servers = [S("a", 2), S("b", 1), S("c", 1)]
    picks = {pick_server(servers, random.Random(i)).name for i in range(20)}
    assert picks == {"b", "c"}


def test_options_from_settings_keep_secrets_secret(monkeypatch):
    monkeypatch.setenv("NATS_USER", "alice")
    monkeypatch.setenv("NATS_PASSWORD", "s3cret")
    monkeypatch.setenv("NATS_URL", "nats://a:1,nats://b:2")
    s = WorkerSettings()
    assert isinstance(s.nats_password, SecretStr) and "s3cret" not in repr(s)
    opts = nats_options(s)
    assert opts.servers == ("nats://a:1", "nats://b:2") and "s3cret" not in repr(opts)
    kw = opts.connect_kwargs()
    assert (kw["user"], kw["password"], kw["max_reconnect_attempts"]) == ("alice", "s3cret", -1)


def test_missing_files_and_half_pairs_are_refused_before_connecting(tmp_path):
    with pytest.raises(NatsConnectError, match="NATS creds file .*nope.creds.*--nats-creds"):
        NatsOptions.from_values("nats://h:1", creds=tmp_path / "nope.creds").check()
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(NatsConnectError, match="both --nats-cert and --nats-key"):
        NatsOptions.from_values("nats://h:1", cert=cert).check()
    with pytest.raises(NatsConnectError, match="needs a user"):
        NatsOptions.from_values("nats://h:1", password="p").check()
    with pytest.raises(TypeError, match="unknown NATS connection option"):
        NatsOptions.from_values("nats://h:1", pasword="p")
    with pytest.raises(NatsConnectError, match="could not load the TLS files"):
        NatsOptions.from_values("nats://h:1", ca=cert).tls_context()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(30)
async def test_an_unreachable_server_fails_within_the_connect_timeout_with_one_line():
    url = f"nats://u:s3cret@127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(NatsConnectError) as info:
        await connect(NatsOptions.from_values(url, connect_timeout_s=1.0))
    took = time.monotonic() - start
    message = str(info.value)
    assert took < 1.0 + 1.0, took  # the stated bound: the connect timeout, plus closing
    assert "\n" not in message and "s3cret" not in message
    assert "within 1 s" in message and "--nats-url / NATS_URL" in message


def test_serve_refuses_bad_nats_options_before_loading_the_model(tmp_path, capsys):
    from poolwire.cli import main

    assert main(["serve", "--nats-url", "nats://127.0.0.1:1", "--nats-nkey",
                 str(tmp_path / "missing.nk")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.nk" in err and "--nats-nkey / NATS_NKEY" in err
    assert main(["serve", "--nats-url", "http://u:s3cret@h:1"]) == 2
    err = capsys.readouterr().err
    assert "scheme 'http'" in err and "s3cret" not in err
