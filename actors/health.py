"""The heartbeat file the self-check writes, and `poolwire health`'s judgement of it.

A file, not a NATS request: the health check runs inside the worker's container (a docker
compose healthcheck), needs no NATS credentials, and names "this" worker by where its state
lives. A worker that is stuck (event loop blocked) stops refreshing the file, so an old
heartbeat is unhealthy too."""

import json
import os
import tempfile
from pathlib import Path

HEALTH_FILE_NAME = "health.json"


def write_heartbeat(path: Path, record: dict) -> None:
    """Atomically, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".health-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_heartbeat(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def judge(record: dict | None, now: float, path: Path) -> tuple[bool, str]:
    """(healthy, one line) from a heartbeat record read at wall-clock time `now`."""
    if not isinstance(record, dict) or not isinstance(record.get("updated"), (int, float)):
        return False, (f"no worker heartbeat at {path}: the worker is not running, or runs with "
                       "another --state-dir / --health-file")
    if record.get("stopped"):
        return False, f"worker {record.get('worker', '?')} has stopped"
    age = now - record["updated"]
    stale_after = float(record.get("stale_after_s", 10.0))
    if age > stale_after:
        return False, (f"worker {record.get('worker', '?')}'s heartbeat is {age:.1f} s old "
                       f"(limit {stale_after:g} s): the worker is stuck or gone")
    reason = str(record.get("reason", ""))
    return bool(record.get("healthy")), f"worker {record.get('worker', '?')}: {reason}"
