"""The deprecation event published on `P.events.deprecation` (PROTOCOL.md)."""

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEPRECATION_EVENT = "pooling.multitask.deprecated"


class DeprecationEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event: Literal["pooling.multitask.deprecated"] = DEPRECATION_EVENT
    time: str = Field(description="RFC 3339, UTC")
    model: str
    worker: str = Field(description="the publishing worker's id")
    request_id: str
    requested_task: str
    configured_task: str
    supported_tasks: list[str]
    message: str
    hint: str = Field(description="how to start a worker for the requested task")


def utc_now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
