"""poolwire: pooling models (embeddings, classifiers, cross-encoders, token classifiers) served
to event-driven pipelines over NATS.

The public API lives here: the client, the worker settings and the task names. The worker's
parts are `poolwire.actors` (runtime, actors, engine), `poolwire.kernels` (pooling kernels) and
`poolwire.schemas` (wire types); importing `poolwire` alone loads neither torch nor a model.
"""

from importlib.metadata import PackageNotFoundError, version

from poolwire.client import PoolingClient, PoolingServiceError
from poolwire.schemas.tasks import TASK_ORDER, Task
from poolwire.settings import WorkerSettings

try:
    __version__ = version("poolwire")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["PoolingClient", "PoolingServiceError", "TASK_ORDER", "Task", "WorkerSettings",
           "__version__"]
