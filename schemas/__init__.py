"""Wire types of poolwire (PROTOCOL.md): task names, requests, reply frames, errors, events,
and the one codec. Nothing here knows NATS or torch."""

from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.tasks import TASK_ORDER, Task

__all__ = ["ErrorCode", "PoolingError", "TASK_ORDER", "Task"]
