"""compose.yaml and the Dockerfile, checked statically (no Docker engine runs here): every
command and variable they use exists in the CLI, and the settings they rely on hold."""

from pathlib import Path

import pytest
import yaml

from poolwire.cli import build_parser
from poolwire.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
WORKERS = {name: svc for name, svc in COMPOSE["services"].items() if svc.get("build")}


def test_nats_runs_jetstream_on_a_volume():
    nats = COMPOSE["services"]["nats"]
    assert "-js" in nats["command"]
    store = nats["command"][nats["command"].index("-sd") + 1]
    assert any(v.endswith(":" + store) for v in nats["volumes"])
    assert nats["volumes"][0].split(":")[0] in COMPOSE["volumes"]


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_worker_commands_parse_with_the_cli(name):
    args = build_parser()[0].parse_args(WORKERS[name]["command"])  # exits on an unknown option
    assert args.command == "serve"


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_worker_environment_is_made_of_real_settings(name, monkeypatch):
    svc = WORKERS[name]
    env = {k: str(v) for k, v in svc["environment"].items()}
    known = {WorkerSettings.env_name(f) for f in WorkerSettings.model_fields} | {"NATS_URL"}
    assert set(env) <= known, set(env) - known
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = WorkerSettings()
    assert settings.nats_url == "nats://nats:4222" and "nats" in svc["depends_on"]
    grace = float(svc["stop_grace_period"].rstrip("s"))
    assert grace > settings.drain_timeout_s  # the drain finishes before a hard kill


def test_the_gpu_worker_asks_for_a_gpu_and_uses_it():
    gpu = WORKERS["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert build_parser()[0].parse_args(gpu["command"]).device == "cuda"


def test_the_dockerfile_installs_the_three_packages_and_runs_poolwire():
    text = (ROOT / "Dockerfile").read_text()
    for package in ("poolwire", "schemas", "kernels", "actors"):
        assert f"COPY {package} ./{package}" in text
    assert "HF_HUB_OFFLINE=1" in text and 'ENTRYPOINT ["poolwire"]' in text
