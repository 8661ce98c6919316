"""Workers as subprocesses (`python -m poolwire serve ...`), so that a test can kill one by PID
as a machine failure would, and a three-node nats-server cluster on loopback (NATS.md 7)."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from poolwire.actors.nats_server import nats_server_binary


def worker_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")  # two workers share this machine's cores
    # The tests run the Triton kernels in the interpreter; a worker runs as deployed (the
    # NumPy ops on CPU), which is also what lets two of them compute at once.
    env.pop("TRITON_INTERPRET", None)
    return env


class WorkerProcess:
    def __init__(self, url: str, prefix: str, *options: str, log_dir: Path) -> None:
        self.args = [sys.executable, "-m", "poolwire", "serve", "--nats-url", url,
                     "--prefix", prefix, *options]
        self.log_path = Path(log_dir) / f"worker-{time.monotonic_ns()}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 120.0) -> "WorkerProcess":
        log = self.log_path.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, stdout=asyncio.subprocess.PIPE, stderr=log, env=worker_env())
        log.close()
        try:
            await asyncio.wait_for(self._ready(), timeout)
        except (asyncio.TimeoutError, RuntimeError):
            await self.close()
            raise RuntimeError(f"worker did not start: {self.log_tail()}")
        return self

    async def _ready(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError("worker exited")
            if line.startswith(b"poolwire: serving"):
                return

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, by PID: the process gets no chance to answer or ack anything."""
        os.kill(self.proc.pid, signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: `poolwire serve` drains and exits 0."""
        os.kill(self.proc.pid, signal.SIGTERM)

    async def wait(self, timeout: float = 60.0) -> int:
        await asyncio.wait_for(self.proc.stdout.read(), timeout)  # to EOF: nothing blocks it
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.kill()
            await self.proc.wait()


def free_ports(n: int) -> list[int]:
    """Ports the OS says are free now. A route port must be known before the nodes start (each
    names the others), so `-1` cannot be used for it; the window for a collision is short."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def first_pick_taken(monkeypatch, taken_port: int) -> list[list[int]]:
    """Make free_ports's first pick end with `taken_port` (a port another process holds), as a
    race with another process would; returns every pick made, for the test to count."""
    real, picks = free_ports, []

    def picked(n: int) -> list[int]:
        ports = real(n)
        if not picks:
            ports[-1] = taken_port
        picks.append(ports)
        return ports

    monkeypatch.setattr(sys.modules[__name__], "free_ports", picked)
    return picks


# Attempts at starting a cluster whose route ports another process took meanwhile (start).
START_ATTEMPTS = 3


class NatsCluster:
    """Three JetStream nodes named A, B, C on 127.0.0.1, each stopped (or killed) by PID."""

    names = ("A", "B", "C")

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="poolwire-cluster-")
        self._top = Path(self._tmp.name)
        self.root = self._top  # the nodes' folder: one per start attempt (start)
        self.procs: dict[str, subprocess.Popen] = {}
        self.urls: dict[str, str] = {}

    def start(self, timeout: float = 15.0) -> "NatsCluster":
        """The three nodes, started again on other route ports (in a fresh folder) where
        another process took one between picking and listening: a client's outgoing
        connection gets its port from the same range."""
        attempt = 1
        while True:
            self.root = self._top / f"attempt-{attempt}"
            self.root.mkdir()
            try:
                return self._start_nodes(timeout)
            except RuntimeError as exc:
                self._stop_nodes()
                if "address already in use" not in str(exc) or attempt >= START_ATTEMPTS:
                    self._tmp.cleanup()
                    raise
            attempt += 1

    def _start_nodes(self, timeout: float) -> "NatsCluster":
        routes = free_ports(len(self.names))
        route_list = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
        for name, route in zip(self.names, routes):
            (self.root / f"{name}.conf").write_text(
                f'server_name: {name}\nlisten: "127.0.0.1:-1"\n'
                f'jetstream {{ store_dir: "{self.root / name}" }}\n'
                f'cluster {{ name: C1, listen: "127.0.0.1:{route}", routes: [ {route_list} ] }}\n')
            (self.root / f"ports-{name}").mkdir()
            self._spawn(name)
        deadline = time.monotonic() + timeout
        for name in self.names:
            self.urls[name] = self._client_url(name, deadline)
        return self

    def restart(self, name: str, timeout: float = 15.0) -> None:
        """Start a killed node again on its client port and store (it rejoins the cluster and
        catches its streams up from the others). The port was free a moment ago, when the node
        died; another process taking it meanwhile fails the start."""
        port = int(self.urls[name].rsplit(":", 1)[1])
        conf = self.root / f"{name}.conf"
        conf.write_text(conf.read_text().replace('listen: "127.0.0.1:-1"',
                                                 f'listen: "127.0.0.1:{port}"'))
        self._spawn(name)
        self._client_url(name, time.monotonic() + timeout)

    def _spawn(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [nats_server_binary(), "-c", str(self.root / f"{name}.conf"), "--ports_file_dir",
             str(self.root / f"ports-{name}"), "-l", str(self.root / f"{name}.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _client_url(self, name: str, deadline: float) -> str:
        """The node's client URL from the ports file it writes once listening. No event says
        so; it is written within ~20 ms (NATS.md section 2), hence the short polls."""
        ports_file = self.root / f"ports-{name}" / f"nats-server_{self.procs[name].pid}.ports"
        while True:
            if time.monotonic() > deadline or self.procs[name].poll() is not None:
                raise RuntimeError(f"node {name} did not start: {self.log(name)}")
            try:
                return json.loads(ports_file.read_text())["nats"][0]
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.01)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def kill(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def stop(self) -> None:
        self._stop_nodes()
        self._tmp.cleanup()

    def _stop_nodes(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        self.urls.clear()

    def __enter__(self) -> "NatsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
