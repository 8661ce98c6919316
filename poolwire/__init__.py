"""poolwire: pooling models (embeddings, classifiers, cross-encoders, token classifiers) served
to event-driven pipelines over NATS.

The public API lives here: the client, the worker settings, the task names, and the offline
API (`PoolingModel` with `PoolerConfig`, its exceptions and deprecation warning). The worker's
parts are `poolwire.actors` (runtime, actors, engine), `poolwire.kernels` (pooling kernels) and
`poolwire.schemas` (wire types); importing `poolwire` alone loads neither torch nor a model.
"""

# First, before any library that phones home is imported (poolwire/telemetry_off.py).
from poolwire import telemetry_off

telemetry_off.apply()

from importlib.metadata import PackageNotFoundError, version  # noqa: E402

from poolwire.offline_errors import (DeadlineExceededError,  # noqa: E402
                                     InputTooLongError, InternalError,
                                     InvalidRequestError, OverloadedError, PayloadTooLargeError,
                                     PoolingDeprecationWarning, PoolingModelError,
                                     TaskNotConfiguredError, UnsupportedTaskError)
from poolwire.pooler_config import PoolerConfig  # noqa: E402
from poolwire.schemas.tasks import TASK_ORDER, Task  # noqa: E402
from poolwire.settings import WorkerSettings  # noqa: E402

try:
    __version__ = version("poolwire")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["PoolingClient", "PoolingServiceError", "TASK_ORDER", "Task", "WorkerSettings",
           "__version__", "PoolingModel", "PoolerConfig", "PoolingDeprecationWarning",
           "PoolingModelError", "InvalidRequestError", "UnsupportedTaskError",
           "TaskNotConfiguredError", "InputTooLongError", "PayloadTooLargeError",
           "OverloadedError", "DeadlineExceededError", "InternalError"]


def __getattr__(name: str):
    # PoolingModel brings torch and transformers, the client nats-py, numpy and Pillow's
    # neighbours: each is loaded on first use, not by `import poolwire`, which every `poolwire`
    # command pays (`poolwire health`, a container's healthcheck, ran into its timeout under
    # load while it imported the client it never uses).
    if name == "PoolingModel":
        from poolwire.offline import PoolingModel

        return PoolingModel
    if name in ("PoolingClient", "PoolingServiceError"):
        from poolwire import client

        return getattr(client, name)
    raise AttributeError(f"module 'poolwire' has no attribute {name!r}")
