"""The exceptions of the offline API (`poolwire.PoolingModel`): one class per protocol error
code (PROTOCOL.md "Errors"), with that code's extra keys as attributes, and the warning a
request on a deprecated (non-configured) task raises. No torch here: `import poolwire` stays
light."""

from typing import Any


class PoolingDeprecationWarning(FutureWarning):
    """A request on a supported task that is not the configured one (vLLM PR #37956): served
    now, refused once multi-task serving is removed. A FutureWarning, so Python shows it by
    default."""


class PoolingModelError(Exception):
    """An error of the offline API, carrying the protocol's code, message and extra keys."""

    code = "internal"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = {k: v for k, v in extra.items() if v is not None}
        for key, value in extra.items():
            setattr(self, key, value)


class InvalidRequestError(PoolingModelError, ValueError):
    code = "invalid_request"
    field: str | None = None


class UnsupportedTaskError(PoolingModelError, ValueError):
    code = "unsupported_task"
    supported_tasks: list[str]


class TaskNotConfiguredError(PoolingModelError, ValueError):
    code = "task_not_configured"
    configured_task: str
    supported_tasks: list[str]


class InputTooLongError(PoolingModelError, ValueError):
    code = "input_too_long"
    max_tokens: int
    index: int


class PayloadTooLargeError(PoolingModelError):
    code = "payload_too_large"


class OverloadedError(PoolingModelError):
    code = "overloaded"
    retry_after_ms: int


class DeadlineExceededError(PoolingModelError):
    code = "deadline_exceeded"


class InternalError(PoolingModelError):
    code = "internal"


ERROR_CLASSES: dict[str, type[PoolingModelError]] = {
    cls.code: cls for cls in (InvalidRequestError, UnsupportedTaskError, TaskNotConfiguredError,
                              InputTooLongError, PayloadTooLargeError, OverloadedError,
                              DeadlineExceededError, InternalError)}


def error_from(code: str, message: str, extra: dict[str, Any]) -> PoolingModelError:
    """The exception of a protocol error (a schemas.errors.PoolingError's parts)."""
    return ERROR_CLASSES.get(code, InternalError)(message, **extra)
