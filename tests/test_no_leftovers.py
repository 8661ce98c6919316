"""Issue 25: OpenVINO workers started and stopped repeatedly (SIGTERM, SIGINT, exit 3, an
embedded nats-server) leave no process behind and write no telemetry under their HOME, and
nothing in them looks a host name up at start (a lookup would wait on an unreachable network).

Each worker runs in a session of its own (its PID is the session id): whatever it forks stays in
that session unless it asks for another, so after it exits /proc must hold no process of that
session, nor any (the embedded nats-server, in a session of its own) with its state dir in its
command line. Each converts the model itself (a state dir of its own), as OpenVINO's converter
is where telemetry started its child. A Python audit hook, inherited by anything it forks,
records every name lookup."""

import os
import select
import signal
import subprocess
import sys

import pytest

from poolwire.models.model import bundled_model_dir
from tests.helpers import processes
from tests.procs import worker_env
from tests.model_zoo import _bert

pytest.importorskip("openvino")

# Names resolved through socket.getaddrinfo & co; numeric addresses never reach a resolver.
AUDIT = r"""
import ipaddress, os, sys
_log = os.environ["LOOKUP_LOG"]
def _hook(event, args):
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                 "socket.gethostbyaddr", "socket.getnameinfo"):
        host = args[0][0] if event == "socket.getnameinfo" else args[0]
        if isinstance(host, bytes):
            host = host.decode()
        try:
            ipaddress.ip_address(str(host).split("%")[0])
        except ValueError:
            with open(_log, "a") as f:
                f.write(f"{os.getpid()} {event} {host!r}\n")
sys.addaudithook(_hook)
sys.argv = ["poolwire", *sys.argv[1:]]
from poolwire.cli import main
sys.exit(main())
"""

WAVE = 5  # workers at once: the machine's memory and cores, not the check, set this


def _start(args, env, cwd):
    return subprocess.Popen([sys.executable, "-c", AUDIT, "serve", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


def _wait_for_line(proc, prefix: bytes, lines: list) -> None:
    for line in proc.stdout:  # ends at EOF: a worker that exits instead is reported below
        lines.append(line)
        if line.startswith(prefix):
            return
    raise AssertionError(b"".join(lines).decode(errors="replace"))


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A plain encoder: one forward kind to convert, the cheapest start OpenVINO has."""
    import torch
    from transformers import AutoTokenizer, BertModel

    folder = tmp_path_factory.mktemp("leftovers") / "encoder"
    torch.manual_seed(5)
    BertModel(_bert()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(folder)
    return folder


def test_openvino_workers_leave_nothing_behind(nats_server, tiny_encoder, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    lookups = tmp_path / "lookups.log"
    env = {**worker_env(), "HOME": str(home), "LOOKUP_LOG": str(lookups),
           "HF_HUB_OFFLINE": "1"}
    # HOME is the telemetry's place; these must not point elsewhere for the check to hold.
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME", "HF_HUB_DISABLE_TELEMETRY",
                 "DO_NOT_TRACK"):
        env.pop(name, None)
    common = ["--model", str(tiny_encoder), "--backend", "openvino", "--device", "cpu",
              "--openvino-threads", "1"]
    # (how it is started, how it is stopped): 10 workers.
    plan = ([("served", signal.SIGTERM), ("served", signal.SIGINT)] * 4
            + [("embedded", signal.SIGTERM), ("unreachable", None)])
    stopped = []
    for first in range(0, len(plan), WAVE):
        running = []
        for i, (kind, sig) in enumerate(plan[first:first + WAVE], start=first):
            state = tmp_path / f"state-{i}"
            args = [*common, "--state-dir", str(state), "--prefix", f"leftovers{i}.pooling"]
            if kind == "served":
                args += ["--nats-url", nats_server.url]
            elif kind == "embedded":
                args += ["--nats-port", "-1"]
            else:  # nothing listens on port 1: NATS unavailable, exit 3 after the model loaded
                args += ["--nats-url", "nats://127.0.0.1:1", "--nats-connect-timeout-s", "1"]
            running.append((kind, sig, state, _start(args, env, tmp_path)))
        for kind, sig, state, proc in running:
            lines = []
            if sig is not None:
                _wait_for_line(proc, b"poolwire: serving", lines)
                os.kill(proc.pid, sig)
            lines += proc.stdout.readlines()
            code = proc.wait(timeout=120)
            log = b"".join(lines).decode(errors="replace")
            assert code == (3 if kind == "unreachable" else 0), log
            if kind == "embedded":
                assert "started an embedded nats-server" in log, log
            stopped.append((proc.pid, state))
    left = [p for p in processes()
            if any(p.sid == worker or str(state) in p.cmdline for worker, state in stopped)]
    assert left == [], left
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert written == [], written  # ~/intel/openvino_telemetry and its client id among them
    assert not lookups.exists(), lookups.read_text()


def test_a_killed_worker_takes_its_embedded_nats_server_with_it(tiny_encoder, tmp_path):
    """SIGKILL (the OOM killer, `docker kill`) runs none of the worker's own cleanup: the
    kernel stops the embedded server (PR_SET_PDEATHSIG), which would otherwise keep running
    and hold the port that the worker's restart asks for."""
    state = tmp_path / "state"
    env = {**worker_env(), "HF_HUB_OFFLINE": "1", "LOOKUP_LOG": str(tmp_path / "lookups.log")}
    proc = _start(["--model", str(tiny_encoder), "--backend", "torch", "--device", "cpu",
                   "--state-dir", str(state), "--nats-port", "-1"], env, tmp_path)
    lines = []
    _wait_for_line(proc, b"poolwire: serving", lines)
    assert b"started an embedded nats-server" in b"".join(lines)
    servers = [p.pid for p in processes()
               if "nats-server" in p.cmdline and str(state) in p.cmdline]
    assert len(servers) == 1, servers
    # A pidfd, opened while the server runs, is readable once that process exits: the test
    # waits on the exit itself (never on a PID the kernel may reuse), not on polls of /proc.
    server = os.pidfd_open(servers[0])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        # nats-server's own shutdown on SIGTERM takes well under 30 s.
        exited, _, _ = select.select([server], [], [], 30)
        if not exited:
            signal.pidfd_send_signal(server, signal.SIGKILL)  # not left to the next run
            raise AssertionError(f"the embedded nats-server {servers[0]} outlived its worker")
    finally:
        os.close(server)
