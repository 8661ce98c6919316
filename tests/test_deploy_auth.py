"""The authenticated deployment in compose.yaml, statically: NATS runs
deploy/nats/nats-server.conf (which nats-server accepts), workers authenticate with an NKey
seed mounted as a secret file, no secret value is written into the compose file, and the
healthcheck asks this container's worker."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

from poolwire.actors.nats_server import nats_server_binary

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
