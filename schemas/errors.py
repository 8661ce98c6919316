"""Error codes of PROTOCOL.md and the exception that carries one to the reply framing."""

from enum import Enum
from typing import Any


class ErrorCode(str, Enum):
    INVALID_REQUEST = "invalid_request"
    UNSUPPORTED_TASK = "unsupported_task"
    TASK_NOT_CONFIGURED = "task_not_configured"
    INPUT_TOO_LONG = "input_too_long"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    OVERLOADED = "overloaded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL = "internal"

    @property
    def status(self) -> int:
        return _STATUS[self]


_STATUS = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNSUPPORTED_TASK: 400,
    ErrorCode.TASK_NOT_CONFIGURED: 400,
    ErrorCode.INPUT_TOO_LONG: 413,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}


class PoolingError(Exception):
    """An error a client sees: a code, a message naming the offending value, and the extra keys
    PROTOCOL.md lists for that code (`field`, `supported_tasks`, `max_tokens`, ...)."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, **self.extra}

    def __repr__(self) -> str:
        return f"PoolingError({self.code.value!r}, {self.message!r}, {self.extra!r})"


def invalid(message: str, field: str | None = None) -> PoolingError:
    return PoolingError(ErrorCode.INVALID_REQUEST, message, field=field)
