"""deploy/k8s, checked offline: every manifest validates against the Kubernetes schemas
(kubernetes-validate) and the ScaledObjects against KEDA's CRD schema (vendored in
deploy/k8s/schemas); every command and variable the manifests use exists in the CLI; the NATS
chart values carry deploy/nats's auth config, which nats-server accepts. Then, against a real
nats-server with its monitoring port: the stream and consumer the ScaledObject names are the
ones a durable worker creates, and the lag read from /jsz as KEDA reads it rises with jobs
published while no worker runs and falls to 0 once they are answered."""

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from urllib.parse import urlparse
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from poolwire.actors.durable import durable_names
from poolwire.actors.metrics import QueueGauges, WorkerMetrics
from poolwire.actors.nats_server import NatsServer, nats_server_binary
from poolwire.actors.worker import Worker
from poolwire.cli import build_parser
from poolwire.client import PoolingClient
from poolwire.operators import LagError, jsz_url, keda_lag
from poolwire.settings import PLAIN_ENV, WorkerSettings
from tests.helpers import poll_until

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())
MANIFESTS = {name: list(yaml.safe_load_all((K8S / name).read_text()))
             for name in KUSTOMIZATION["resources"]}
OBJECTS = [doc for docs in MANIFESTS.values() for doc in docs]
BY_KIND_NAME = {(doc["kind"], doc["metadata"]["name"]): doc for doc in OBJECTS}
DEPLOYMENTS = {doc["metadata"]["name"]: doc for doc in OBJECTS if doc["kind"] == "Deployment"}
SCALED = {doc["metadata"]["name"]: doc for doc in OBJECTS if doc["kind"] == "ScaledObject"}
KEDA_SCHEMA = yaml.safe_load((K8S / "schemas" / "keda.sh_scaledobjects.v1alpha1.yaml").read_text())
NATS_VALUES = yaml.safe_load((K8S / "nats-values.yaml").read_text())
K8S_VERSION = "1.33.0"  # a current release; kubernetes-validate carries the schemas offline


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(deployment: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment)["env"]}


def settings_of(deployment: dict, monkeypatch) -> WorkerSettings:
    """The worker settings the container's environment and args give, as the CLI reads them
    (the environment is set only while they are read)."""
    with monkeypatch.context() as m:
        for key, value in env_of(deployment).items():
            m.setenv(key, value)
        parser, source = build_parser()
        args = parser.parse_args(container(deployment)["args"])
        assert args.command == "serve"
        return WorkerSettings(_cli_settings_source=source(parsed_args=args))


def durable_trigger(scaled: dict) -> dict:
    (trigger,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "nats-jetstream"]
    return trigger["metadata"]


# ---- offline: schemas ----

def test_the_manifests_are_plain_yaml_without_anchors_or_octal():
    """kubectl reads YAML 1.1 and kustomize 1.2: anchors, merge keys and leading-zero numbers
    are where the two can disagree."""
    for name in [*KUSTOMIZATION["resources"], "kustomization.yaml", "nats-values.yaml"]:
        for line in (K8S / name).read_text().splitlines():
            code = line.split("#", 1)[0]
            assert "<<:" not in code and ": &" not in code and ": *" not in code, (name, line)
            assert not re.search(r":\s+0\d+\s*$", code), (name, line)


def test_the_kustomization_lists_every_manifest_in_the_folder():
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "nats-values.yaml"}
    assert set(KUSTOMIZATION["resources"]) == on_disk
    assert {d["kind"] for d in OBJECTS} == {"Deployment", "Service", "PodDisruptionBudget",
                                            "ScaledObject"}


@pytest.mark.parametrize("doc", [d for d in OBJECTS if d["kind"] != "ScaledObject"],
                         ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_kubernetes_objects_validate_against_the_kubernetes_schemas(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises naming the field


@pytest.mark.parametrize("name", sorted(SCALED))
def test_scaled_objects_validate_against_kedas_crd_schema(name):
    jsonschema.validate(SCALED[name], KEDA_SCHEMA)
    target = SCALED[name]["spec"]["scaleTargetRef"]["name"]
    assert target in DEPLOYMENTS


def test_the_keda_schema_check_can_fail():
    """The vendored schema is the real one: a trigger value that is not a string is refused,
    as the KEDA API server would."""
    bad = json.loads(json.dumps(SCALED["poolwire-durable"]))
    bad["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 512
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, KEDA_SCHEMA)


# ---- offline: the manifests use real commands, settings and names ----

@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_worker_args_probes_and_environment_are_real_cli_settings(name, monkeypatch):
    deployment = DEPLOYMENTS[name]
    c = container(deployment)
    known = {WorkerSettings.env_name(f) for f in WorkerSettings.model_fields} | set(PLAIN_ENV.values())
    assert set(env_of(deployment)) <= known, set(env_of(deployment)) - known
    settings = settings_of(deployment, monkeypatch)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = c[probe]["exec"]["command"]
        assert command == ["poolwire", "health"], (probe, command)
        assert build_parser()[0].parse_args(command[1:]).command == "health"
    assert str(settings.health_file).startswith("/tmp/")
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # where the heartbeat goes
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.drain_timeout_s
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert settings.metrics_port == port and settings.metrics_host == "0.0.0.0"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_the_nkey_seed_comes_from_a_secret_and_no_secret_is_inline(name, monkeypatch):
    deployment = DEPLOYMENTS[name]
    pod = deployment["spec"]["template"]["spec"]
    settings = settings_of(deployment, monkeypatch)
    mount = next(m for m in container(deployment)["volumeMounts"] if m["name"] == "nkey")
    assert str(settings.nats_nkey).startswith(mount["mountPath"] + "/") and mount["readOnly"]
    volume = next(v for v in pod["volumes"] if v["name"] == "nkey")
    assert volume["secret"]["secretName"] == "poolwire-worker-nkey"
    # The image's user (uid 10001) reads the seed through the group fsGroup gives it.
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 10001
    assert volume["secret"]["defaultMode"] & 0o040
    secrets = {"NATS_PASSWORD", "NATS_TOKEN", "POOLWIRE_NATS_PASSWORD", "POOLWIRE_NATS_TOKEN"}
    assert not set(env_of(deployment)) & secrets
    assert "@" not in settings.nats_url
    assert not [d for d in OBJECTS if d["kind"] == "Secret"]  # made from the seed file, not git


def test_the_metrics_service_selects_both_deployments_on_the_metrics_port():
    service = BY_KIND_NAME[("Service", "poolwire-metrics")]
    for deployment in DEPLOYMENTS.values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_pod_disruption_budgets_select_their_deployments():
    for pdb in (d for d in OBJECTS if d["kind"] == "PodDisruptionBudget"):
        deployment = DEPLOYMENTS[pdb["metadata"]["name"]]
        assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert BY_KIND_NAME[("PodDisruptionBudget", "poolwire-worker")]["spec"]["minAvailable"] >= 1


def test_the_durable_scaler_watches_the_names_the_durable_workers_create(monkeypatch):
    scaled = SCALED["poolwire-durable"]
    settings = settings_of(DEPLOYMENTS[scaled["spec"]["scaleTargetRef"]["name"]], monkeypatch)
    assert settings.durable
    names = durable_names(settings.prefix, settings.queue)
    meta = durable_trigger(scaled)
    assert (meta["stream"], meta["consumer"]) == (names.stream, names.consumer)
    assert scaled["spec"]["minReplicaCount"] == 0
    # The endpoint is the chart's Service on the monitoring port the values open.
    # The chart's headless Service (every server, by name) on the monitoring port the values
    # open, in the namespace and release the workers' NATS_URL names (`helm install nats`).
    host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
    assert int(port) == NATS_VALUES["config"]["monitor"]["port"]
    service, namespace_and_domain = host.split(".", 1)
    nats_host = urlparse(settings.nats_url).hostname
    assert service == nats_host.split(".")[0] + "-headless"
    assert namespace_and_domain == nats_host.split(".", 1)[1]


def test_the_request_scaler_queries_a_metric_the_workers_export():
    scaled = SCALED["poolwire-worker"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # request/reply cannot wait at zero workers
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    metrics = WorkerMetrics()
    metrics.watch(QueueGauges(lambda: 3, lambda: 40, lambda: {}))
    exported = {family.name for family in metrics.registry.collect()}
    query = trigger["metadata"]["query"]
    metric = query[query.index("(") + 1:query.index("{")]
    assert metric in exported, (metric, exported)


def test_the_chart_values_carry_deploy_nats_auth_and_nats_server_accepts_them(tmp_path):
    conf = (ROOT / "deploy/nats/nats-server.conf").read_text()
    auth = NATS_VALUES["configMap"]["merge"]["data"]["poolwire-auth.conf"]
    assert auth == conf[conf.index("WORKER = {"):]
    assert NATS_VALUES["config"]["jetstream"]["enabled"] and NATS_VALUES["config"]["cluster"]["enabled"]
    assert set(NATS_VALUES["container"]["env"]) == {"POOLWIRE_WORKER_NKEY", "POOLWIRE_PUBLISHER_NKEY"}
    # What the chart renders: its own settings, then the include the values ask for.
    (include,) = [v for k, v in NATS_VALUES["config"]["merge"].items() if k.endswith("$include")]
    (tmp_path / include).write_text(auth)
    (tmp_path / "nats.conf").write_text(
        f"port: 4222\nhttp_port: {NATS_VALUES['config']['monitor']['port']}\n"
        f"jetstream {{ store_dir: {tmp_path / 'js'} }}\ninclude {include}\n")
    made = subprocess.run([sys.executable, str(ROOT / "deploy/nats/make_nkeys.py"), str(tmp_path / "k")],
                          capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in made.stdout.split())
    checked = subprocess.run([nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
                             capture_output=True, text=True, env={**os.environ, **env}, timeout=30)
    assert checked.returncode == 0, checked.stderr


# ---- the names and the lag as KEDA reads it (pure) ----

def test_durable_names_are_what_the_readme_documents():
    assert durable_names("pooling", "poolwire") == ("POOLWIRE_JOBS_POOLING", "poolwire_poolwire")
    assert durable_names("pooling.classifier", "team a") == (
        "POOLWIRE_JOBS_POOLING_CLASSIFIER", "poolwire_team_a")
    assert durable_names("pooling", "poolwire", "DOCS") == ("DOCS", "poolwire_pipeline_DOCS_poolwire")


def test_keda_lag_adds_pending_and_ack_pending_and_names_what_is_missing():
    jsz = {"account_details": [{"name": "$G", "stream_detail": [
        {"name": "S", "state": {"last_seq": 9},
         "consumer_detail": [{"name": "C", "num_pending": 4, "num_ack_pending": 3}]}]}]}
    assert keda_lag(jsz, "$G", "S", "C")["lag"] == 7
    # No such consumer: KEDA falls back to the stream's last sequence.
    assert keda_lag(jsz, "$G", "S", "other") == {
        "stream": "S", "consumer": "other", "consumer_found": False, "num_pending": None,
        "num_ack_pending": None, "lag": 9}
    with pytest.raises(LagError, match="stream 'T' not found.*streams: S"):
        keda_lag(jsz, "$G", "T", "C")
    with pytest.raises(LagError, match="account 'APP'.*accounts: \\$G"):
        keda_lag(jsz, "APP", "S", "C")
    assert jsz_url("nats.nats.svc:8222", "$G") == \
        "http://nats.nats.svc:8222/jsz?acc=$G&consumers=true&config=true"


# ---- against a real nats-server with its monitoring port ----

def read_jsz_as_keda(server: NatsServer) -> dict:
    with urllib.request.urlopen(jsz_url(server.monitoring_url, "$G"), timeout=5) as answer:
        return json.loads(answer.read())


@pytest.mark.timeout(120)
async def test_a_durable_worker_creates_what_keda_watches_and_the_lag_follows_the_jobs(
        minilm, tmp_path, monkeypatch):
    scaled = SCALED["poolwire-durable"]
    meta = durable_trigger(scaled)
    settings = settings_of(DEPLOYMENTS[scaled["spec"]["scaleTargetRef"]["name"]], monkeypatch)
    jobs = 6
    with NatsServer(store_dir=tmp_path / "nats", monitoring=True) as server:
        def lag() -> dict:
            return keda_lag(read_jsz_as_keda(server), meta["account"], meta["stream"],
                            meta["consumer"])

        # The deployment's prefix and queue, on this test's own server.
        worker = Worker(WorkerSettings(prefix=settings.prefix, queue=settings.queue, durable=True,
                                       durable_replicas=1), minilm)
        await worker.start(server.url)
        await worker.stop()
        account = next(a for a in read_jsz_as_keda(server)["account_details"]
                       if a["name"] == meta["account"])
        jobs_streams = [s for s in account["stream_detail"] if s["name"].startswith("POOLWIRE_JOBS")]
        assert [s["name"] for s in jobs_streams] == [meta["stream"]]
        assert [c["name"] for c in jobs_streams[0]["consumer_detail"]] == [meta["consumer"]]
        assert lag() == {"stream": meta["stream"], "consumer": meta["consumer"],
                         "consumer_found": True, "num_pending": 0, "num_ack_pending": 0, "lag": 0}

        async with PoolingClient(server.url, prefix=settings.prefix, timeout=60) as client:
            waiting = [asyncio.ensure_future(client.submit("embed", {"input": [f"job {i}"]}))
                       for i in range(jobs)]

            async def all_waiting() -> bool:
                return (await asyncio.to_thread(lag))["lag"] == jobs
            await poll_until(all_waiting)
            assert not any(w.done() for w in waiting)
            # The operator's command reads the same figure.
            shown = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "poolwire", "lag", "--prefix", settings.prefix,
                                 "--queue", settings.queue, "--monitoring-url", server.monitoring_url,
                                 "--json"], capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["lag"] == jobs

            worker = Worker(WorkerSettings(prefix=settings.prefix, queue=settings.queue,
                                           durable=True), minilm)
            await worker.start(server.url)
            try:
                replies = await asyncio.wait_for(asyncio.gather(*waiting), 60)
                assert len(replies) == jobs and all(r["data"] for r in replies)

                async def drained() -> bool:
                    return (await asyncio.to_thread(lag))["lag"] == 0
                await poll_until(drained)
            finally:
                await worker.stop()


async def test_the_lag_command_falls_back_to_the_jetstream_api(minilm, nats_server, prefix):
    """Without --monitoring-url: the same figures through $JS.API.CONSUMER.INFO."""
    worker = Worker(WorkerSettings(prefix=prefix, queue="lagq", durable=True), minilm)
    await worker.start(nats_server.url)
    await worker.stop()
    names = durable_names(prefix, "lagq")
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "poolwire", "lag", "--nats-url", nats_server.url,
                         "--prefix", prefix, "--queue", "lagq"],
        capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("0  (num_pending 0 + num_ack_pending 0")
    assert names.stream in shown.stdout and names.consumer in shown.stdout
    wrong = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "poolwire", "lag", "--nats-url", nats_server.url,
                         "--prefix", prefix, "--queue", "no-such-queue"],
        capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "no consumer 'poolwire_no-such-queue'" in wrong.stderr
