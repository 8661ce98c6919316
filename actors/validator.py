"""The ValidatorActor: the one place that decides tasks. It applies the TaskPolicy, validates
the request's fields against the task and the model, writes the deprecation event of a request
on a deprecated task (the engine publishes it once the request is admitted), and hands valid
jobs to the engine."""

import logging
from dataclasses import dataclass, replace

from poolwire.actors.messages import Incoming, Job
from poolwire.models.model_fields import ModelFacts, check_model_fields, texts_as_strings
from poolwire.actors.replier import Replier
from poolwire.actors.runtime import Actor, MailboxFull
from poolwire.actors.stats import StageStats
from poolwire.actors.task_policy import TaskPolicy, Verdict
from poolwire.actors.tracing import trace_of
from poolwire.models.tokenizing import check_truncation
from poolwire.schemas.errors import ErrorCode, PoolingError
from poolwire.schemas.events import DeprecationEvent, utc_now_rfc3339
from poolwire.schemas.requests import PoolingRequest, parse_request
from poolwire.schemas.sanity import preview
from poolwire.schemas.tasks import Task, parse_task

log = logging.getLogger(__name__)

DEPRECATION_HEADER = "Pooling-Deprecation"


@dataclass(frozen=True)
class ModelLimits:
    """What the validator needs to know of the model to range-check fields."""

    name: str
    max_length: int
    embedding_size: int
    facts: ModelFacts | None = None  # prompts, Matryoshka sizes, score kind (model_fields.py)


def check_against_model(task: Task, request: PoolingRequest, limits: ModelLimits) -> None:
    check_truncation(request.truncate_prompt_tokens, limits.max_length)
    check_model_fields(task, request, limits.facts or ModelFacts(limits.name, limits.embedding_size))


def deprecation_message(requested: Task, configured: Task) -> str:
    return (f"serving task '{requested}' from a deployment configured for '{configured}' is "
            f"deprecated (vLLM PR #37956) and will be refused once multi-task serving is removed")


class ValidatorActor(Actor):
    name = "validator"

    def __init__(self, policy: TaskPolicy, limits: ModelLimits, engine: Actor, replier: Replier,
                 worker_id: str, stats: StageStats | None = None,
                 mailbox_size: int = 4096) -> None:
        super().__init__(mailbox_size)
        self.stats = stats or StageStats()
        self.policy = policy
        self.limits = limits
        self._engine = engine
        self._replier = replier
        self._worker_id = worker_id
        self._logged: set[Task] = set()

    def _supported_names(self) -> list[str]:
        return [t.value for t in self.policy.supported]

    def _task_error(self, requested: str, verdict: str) -> PoolingError:
        supported = self._supported_names()
        if verdict == Verdict.UNSUPPORTED:
            return PoolingError(ErrorCode.UNSUPPORTED_TASK,
                                f"task {preview(requested)} is not supported by {self.limits.name}; "
                                f"supported tasks: {', '.join(supported)}",
                                supported_tasks=supported)
        configured = self.policy.configured.value
        return PoolingError(ErrorCode.TASK_NOT_CONFIGURED,
                            f"task {preview(requested)} is supported by {self.limits.name} but this "
                            f"worker serves only {configured!r} (multi-task serving is "
                            f"deprecated); start a worker with --task {requested}",
                            configured_task=configured, supported_tasks=supported)

    async def receive(self, incoming: Incoming) -> None:
        trace = trace_of(incoming)
        try:
            with self.stats.timed("validate"), trace.stage("validate"):
                job = self._validate(incoming)
        except PoolingError as err:
            await self._replier.send_error(incoming.reply, incoming.request_id, err, incoming.fmt,
                                           self._error_headers(incoming.task_name, trace.headers))
            trace.set(task=incoming.task_name, configured_task=self.policy.configured.value)
            trace.end(err.code)
            return
        trace.set(task=job.task.value, configured_task=self.policy.configured.value,
                  deprecated=job.deprecation is not None)
        try:
            self._engine.tell(job)
        except MailboxFull:
            await self._replier.send_error(
                job.reply, job.request_id,
                PoolingError(ErrorCode.OVERLOADED, "the worker's engine queue is full; retry later",
                             retry_after_ms=100), job.fmt, job.headers)
            trace.end(ErrorCode.OVERLOADED)
            return

    def _error_headers(self, task_name: str, headers: dict[str, str] | None):
        """PROTOCOL.md: every frame of a request on a deprecated task carries the
        Pooling-Deprecation header, the error frame of one refused for its fields too."""
        task = parse_task(task_name)
        if task is None or self.policy.judge(task) != Verdict.DEPRECATED:
            return headers
        return self._with_deprecation_header(headers)

    def _with_deprecation_header(self, headers: dict[str, str] | None) -> dict[str, str]:
        """A deprecated-task request's headers: its own, and Pooling-Deprecation naming the
        configured task."""
        return {**(headers or {}), DEPRECATION_HEADER: self.policy.configured.value}

    def _validate(self, incoming: Incoming) -> Job:
        task = parse_task(incoming.task_name)
        verdict = self.policy.judge(task)
        if verdict in (Verdict.UNSUPPORTED, Verdict.NOT_CONFIGURED):
            raise self._task_error(incoming.task_name, verdict)
        request = parse_request(task, incoming.body)
        check_against_model(task, request, self.limits)
        if not (self.limits.facts and self.limits.facts.images):
            request = texts_as_strings(request)
        job = Job(request=request, task=task, reply=incoming.reply, fmt=incoming.fmt,
                  request_id=incoming.request_id, received_at=incoming.received_at,
                  solo=incoming.solo, reserve=incoming.reserve,
                  trace=incoming.trace, headers=trace_of(incoming).headers)
        if verdict == Verdict.DEPRECATED:
            job = self._deprecated(job)
        return job

    def _deprecated(self, job: Job) -> Job:
        """The warning, header and event of a request on a supported, non-configured task."""
        configured = self.policy.configured
        task = self.policy.worker_task_for(job.task)  # score: the task it is computed with
        message = deprecation_message(job.task, configured)
        if job.task not in self._logged:
            self._logged.add(job.task)
            log.warning("%s; start a worker with --task %s to serve it (logged once per task; "
                        "every such request publishes an event)", message, task)
        event = DeprecationEvent(
            time=utc_now_rfc3339(), model=self.limits.name, worker=self._worker_id,
            request_id=job.request_id, requested_task=job.task.value,
            configured_task=configured.value, supported_tasks=self._supported_names(),
            message=message,
            hint=f"start a worker for this task: poolwire serve --task {task} "
                 f"(or POOLWIRE_TASK={task})")
        return replace(job, warnings=(message,),
                       headers=self._with_deprecation_header(job.headers),
                       deprecation=event)

    async def on_failure(self, incoming: Incoming, exc: BaseException) -> None:
        trace = trace_of(incoming)
        await self._replier.send_error(incoming.reply, incoming.request_id,
                                       PoolingError(ErrorCode.INTERNAL, f"internal error: {exc!r}"),
                                       incoming.fmt, trace.headers)
        trace.end(ErrorCode.INTERNAL)
