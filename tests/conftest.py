"""Shared fixtures: a real nats-server per test session, the bundled MiniLM, and workers on a
fresh subject prefix per test."""

import os

# Before anything imports `kernels`: its Triton kernels are decorated for the interpreter, so
# every pooling call in the tests runs the real Triton kernel on CPU (DESIGN.md "Kernels").
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The checkout's root after the installed packages (bench/__init__.py says why): `python -m
# pytest` puts it first, where its kernels/ would stand for Hugging Face's `kernels`.
from bench import checkout_after_installed_packages  # noqa: E402

checkout_after_installed_packages()

import contextlib  # noqa: E402
import itertools  # noqa: E402
import random  # noqa: E402

import nats  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from poolwire.models.model import bundled_model_dir, load_model  # noqa: E402
from poolwire.actors.nats_server import NatsServer  # noqa: E402
from poolwire.settings import WorkerSettings  # noqa: E402
from poolwire.actors.worker import Worker  # noqa: E402
from tests.helpers import drop_streams_under, wait_until_answering  # noqa: E402

_prefixes = itertools.count()
_session_server: list[NatsServer] = []  # the session's nats-server, once a test started it


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def nats_server():
    with NatsServer() as server:
        _session_server.append(server)
        yield server


@pytest.fixture(scope="session")
def minilm():
    return load_model(bundled_model_dir())


@pytest.fixture(scope="session")
def small_model_dirs(tmp_path_factory):
    """Folders of a 3-label and a 1-label (cross-encoder) sequence classifier, a multi-label
    sequence classifier and a 5-label token classifier."""
    from tests.small_models import build

    root = tmp_path_factory.mktemp("models")
    tok = bundled_model_dir()
    return {
        "seq3": build(root / "seq3", tok, "sequence", 3, seed=1),
        "seq1": build(root / "cross-encoder", tok, "sequence", 1, seed=2),
        "multi": build(root / "multi", tok, "sequence", 4, seed=3,
                       problem_type="multi_label_classification"),
        "tok5": build(root / "tok5", tok, "token", 5, seed=4),
    }


@pytest.fixture(scope="session")
def small_models(small_model_dirs):
    return {name: load_model(path) for name, path in small_model_dirs.items()}


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory):
    """The model zoo of issue 11 (tests/model_zoo.py), built once per session."""
    from tests.model_zoo import build_zoo

    return build_zoo(tmp_path_factory.mktemp("zoo"), bundled_model_dir())


@pytest.fixture(scope="session")
def zoo(zoo_dirs):
    """Zoo models loaded by poolwire, each on first use."""
    loaded: dict = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_model(zoo_dirs[name])
        return loaded[name]

    return get


@pytest.fixture
def prefix():
    """A fresh subject prefix per test, so tests never see each other's traffic. Afterwards the
    streams the test's workers made under it on the session's server go (helpers.py says why)."""
    name = f"t{next(_prefixes)}.pooling"
    yield name
    if _session_server:
        drop_streams_under(_session_server[0].url, name)


@pytest.fixture
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def start_worker(nats_server, prefix):
    """`async with start_worker(model, task=..., ...) as worker:` on this test's prefix."""

    @contextlib.asynccontextmanager
    async def _start(model, url=None, **settings):
        worker = Worker(WorkerSettings(prefix=prefix, **settings), model)
        await worker.start(url or nats_server.url)
        try:
            await wait_until_answering(url or nats_server.url, prefix)
            yield worker
        finally:
            await worker.stop()

    return _start


@pytest.fixture
def report(request):
    """`report(what, **figures)`: one line of the figures a failure test measured, for
    RELIABILITY.md (`pytest -s` shows them)."""
    def _report(what: str, **figures) -> None:
        values = ", ".join(f"{k}={v}" for k, v in figures.items())
        print(f"\nFIGURES {request.node.name}: {what}: {values}")
    return _report


def pytest_addoption(parser):
    group = parser.getgroup("soak", "the chaos soak (tests/test_soak_chaos.py)")
    group.addoption("--soak-minutes", type=float, nargs="?", const=60.0, default=None,
                    help="run the chaos soak this long (60 when given without a value); "
                         "default: the 2-minute version of `make test`")
    group.addoption("--soak-seed", type=int, default=None,
                    help="the seed of the soak's fault schedule; default: the fixed seeds")
