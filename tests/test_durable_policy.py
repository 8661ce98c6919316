"""The durable intake's pure decisions (actors/durable_policy.py) and the pipeline's subject and
document rules (actors/pipeline.py)."""

import asyncio
import random

import msgpack
import nats.errors
import pytest
from nats.js.errors import NotFoundError, ServiceUnavailableError

from poolwire.actors.durable_policy import (POISON_SPAN_S, STORE_RETRY_S, Outcome, compute_alone,
                                            counts_as_failure, dead_letter, exhausted, on_error,
                                            pull_size, retry_delay, store_retry_delay)
from poolwire.actors.framing import header_bytes
from poolwire.actors.durable import jetstream_busy, through_elections
from poolwire.actors.durable_intakes import pipeline_spec
from poolwire.actors.pipeline import PipelineSpec, output_subject, request_for
from poolwire.actors.task_policy import TaskPolicy
from poolwire.schemas.tasks import Task
from poolwire.settings import WorkerSettings
from poolwire.schemas.errors import ErrorCode, PoolingError


@pytest.mark.parametrize("code", [ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_TASK,
                                  ErrorCode.TASK_NOT_CONFIGURED, ErrorCode.INPUT_TOO_LONG,
                                  ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.DEADLINE_EXCEEDED])
def test_the_jobs_own_errors_are_final_on_the_first_delivery(code):
    assert on_error(code, failures=1, max_deliveries=5) is Outcome.REJECT


def test_a_failed_computation_is_counted_and_dead_letters_at_the_bound():
    code = ErrorCode.INTERNAL
    assert counts_as_failure(code)
    assert [on_error(code, f, 3) for f in (1, 2, 3)] == [Outcome.RETRY, Outcome.RETRY, Outcome.DEAD]
    assert on_error(code, 1, 1) is Outcome.DEAD


def test_what_is_not_the_documents_fault_is_retried_and_never_dead_letters():
    # overloaded is the worker's state; a failure that could not be recorded (the KV bucket had
    # no leader) is not counted: however often either happens, the job is delivered again.
    assert not counts_as_failure(ErrorCode.OVERLOADED)
    assert all(on_error(ErrorCode.OVERLOADED, f, 3) is Outcome.RETRY for f in (None, 1, 3, 100))
    assert on_error(ErrorCode.INTERNAL, None, 1) is Outcome.RETRY


def test_deliveries_without_an_answer_dead_letter_only_after_the_count_and_the_span():
    # A run of infrastructure faults: many deliveries within a few elections. Not exhausted.
    assert not exhausted(deliveries=40, age_s=120.0, max_deliveries=5, span_s=300.0)
    # A message that waited in a backlog for an hour, delivered a second time: not exhausted.
    assert not exhausted(2, 3600.0, 5, 300.0)
    assert not exhausted(5, 3600.0, 5, 300.0)
    # A document that kills every worker computing it: ends once both are passed.
    assert exhausted(6, 300.0, 5, 300.0)
    assert exhausted(6, 301.0, 5)  # the default span: 20 leader elections of 15 s
    assert POISON_SPAN_S >= 20 * 15


def test_a_failed_store_is_retried_for_longer_than_a_leader_election():
    delays, elapsed = [], 0.0
    while (d := store_retry_delay(len(delays) + 1, elapsed)) is not None:
        delays.append(d)
        elapsed += d
    assert delays[:5] == [0.25, 0.5, 1.0, 2.0, 4.0] and max(delays) == 4.0
    # Longer than several elections of 8 to 17 s in a row; the old nak schedule gave up in 2.5 s.
    assert elapsed == pytest.approx(STORE_RETRY_S) and STORE_RETRY_S >= 3 * 17
    assert 15 <= len(delays) <= 25
    assert store_retry_delay(1, 60.0) is None and store_retry_delay(3, 59.9) == pytest.approx(0.1)


def test_retry_delays_grow_with_deliveries_and_are_jittered():
    rng = random.Random(1)
    first = [retry_delay(1, 0.5, rng) for _ in range(200)]
    third = [retry_delay(3, 0.5, rng) for _ in range(200)]
    assert all(0.25 <= d <= 0.75 for d in first) and all(0.75 <= d <= 2.25 for d in third)
    assert len(set(first)) > 100  # jittered: two failed jobs rarely come back together


def test_pull_size_keeps_within_capacity_and_stops_while_the_engine_queue_is_half_full():
    assert pull_size(in_flight=0, capacity=256, queued_tokens=0, max_queued_tokens=1000, batch=64) == 64
    assert pull_size(250, 256, 0, 1000, 64) == 6
    assert pull_size(256, 256, 0, 1000, 64) == 0
    assert pull_size(300, 256, 0, 1000, 64) == 0
    assert pull_size(0, 256, 499, 1000, 64) == 64
    assert pull_size(0, 256, 500, 1000, 64) == 0


def test_output_subject_replaces_the_configured_input_root():
    assert output_subject("docs.in.42", "docs.in", "docs.embedded") == "docs.embedded.42"
    assert output_subject("docs.in.a.b", "docs.in", "out") == "out.a.b"
    with pytest.raises(ValueError, match="docs.inbox.1"):
        output_subject("docs.inbox.1", "docs.in", "docs.embedded")


def test_a_document_becomes_a_request_and_a_missing_field_is_named():
    spec = PipelineSpec(stream="DOCS", input="docs.in", output="docs.out", task="embed",
                        text_field="body")
    assert request_for({"body": "hi", "id": 3}, spec, "DOCS:7") == {
        "input": "hi", "request_id": "DOCS:7", "truncate_prompt_tokens": -1}
    with pytest.raises(PoolingError) as info:
        request_for({"text": "hi"}, spec, "DOCS:8")
    assert "'body'" in info.value.message and "text" in info.value.message
    assert info.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(PoolingError, match="list"):
        request_for(["hi"], spec, "DOCS:9")


def test_later_deliveries_and_the_last_one_are_computed_alone():
    assert [compute_alone(d, 5) for d in (1, 2, 3, 5)] == [False, False, True, True]
    assert [compute_alone(d, 2) for d in (1, 2)] == [False, True]


def test_pipeline_settings_are_checked_before_a_worker_connects():
    policy = TaskPolicy(configured=Task.EMBED, supported=(Task.EMBED, Task.TOKEN_EMBED, Task.SCORE),
                        multitask="warn", score_with_configured=True)
    spec = pipeline_spec(WorkerSettings(pipeline_stream="DOCS", pipeline_input="docs.in",
                                        pipeline_output="docs.embedded"), policy)
    assert (spec.task, spec.input, spec.output, spec.id_field) == ("embed", "docs.in", "docs.embedded", None)
    with pytest.raises(ValueError, match="--pipeline-output"):
        pipeline_spec(WorkerSettings(pipeline_stream="DOCS", pipeline_input="docs.in"), policy)
    with pytest.raises(ValueError, match="equals"):
        pipeline_spec(WorkerSettings(pipeline_stream="DOCS", pipeline_input="a.b",
                                     pipeline_output="a.b"), policy)
    with pytest.raises(ValueError, match="classify.*supported tasks: embed"):
        pipeline_spec(WorkerSettings(pipeline_stream="DOCS", pipeline_input="a", pipeline_output="b",
                                     pipeline_task="classify"), policy)


def test_stats_show_each_workers_durable_intakes_as_a_table():
    from poolwire.operators import INTAKE_COLUMNS, format_table, intake_rows

    counters = {"pending": 12, "in_progress": 3, "redelivered": 256, "dead_lettered": 1,
                "retried": 2, "completed": 700}
    answers = [{"id": "x", "metadata": {"worker": "w2", "prefix": "a"},
                "endpoints": [{"data": {"batches": 1, "durable": counters, "pipeline": counters}}]},
               {"id": "y", "metadata": {"worker": "w1", "prefix": "a"},
                "endpoints": [{"data": {"batches": 1}}]},
               {"id": "z", "metadata": {"worker": "w3", "prefix": "b"},
                "endpoints": [{"data": {"durable": counters}}]}]
    rows = intake_rows(answers, "a")
    assert rows == [("w2", "durable", "12", "3", "256", "1", "2", "700"),
                    ("w2", "pipeline", "12", "3", "256", "1", "2", "700")]
    table = format_table(INTAKE_COLUMNS, rows).splitlines()
    assert "jobs pending" in table[0] and "dead-lettered" in table[0] and len(table) == 3
    assert "retried" in table[0]  # every counter DURABLE.md names is a column
    assert len(intake_rows(answers)) == 3


RECORD = {"request_id": "DOCS:7", "task": "embed", "deliveries": 5,
          "error": {"code": "internal", "message": "the batch failed: " + "e" * 2000}}


def test_a_dead_letter_that_fits_carries_the_whole_job():
    body, headers = dead_letter(RECORD, b"job", {"Nats-Msg-Id": "m"}, 1 << 20, "DOCS", 7)
    assert msgpack.unpackb(body) == {**RECORD, "job": b"job"} and headers == {"Nats-Msg-Id": "m"}


@pytest.mark.parametrize("max_payload", [400, 1000, 3000, 3500])
def test_a_dead_letter_over_max_payload_leaves_out_the_job_then_cuts_the_error(max_payload):
    job = b"j" * 3000
    headers = {"Nats-Msg-Id": "m", "Pooling-Note": "n" * 200}
    body, kept = dead_letter(RECORD, job, headers, max_payload, "DOCS", 7)
    assert len(body) + header_bytes(kept) <= max_payload
    record = msgpack.unpackb(body)
    assert record["job"] is None and record["job_bytes"] == 3000
    assert (record["stream"], record["seq"], record["deliveries"]) == ("DOCS", 7, 5)
    assert record["error"]["code"] == "internal"
    if max_payload < 2400:
        assert "(shortened from 2018 chars)" in record["error"]["message"]
    # 400: the shortened record (about 330 bytes) leaves no room for the job's headers.
    assert kept == (None if max_payload == 400 else headers)


class _Intake:
    """An intake whose bind fails with each of `failures` in turn, then works."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.binds = 0

    async def bind(self) -> None:
        self.binds += 1
        if self.failures:
            raise self.failures.pop(0)


async def test_a_bind_is_run_again_while_jetstream_elects_a_leader():
    intake = _Intake(nats.errors.TimeoutError(), ServiceUnavailableError(code=503, err_code=10008))
    await through_elections("fake", intake.bind, limit_s=10)
    assert intake.binds == 3


async def test_a_bind_failing_otherwise_is_raised_at_once():
    intake = _Intake(NotFoundError(code=404), nats.errors.TimeoutError())
    with pytest.raises(NotFoundError):
        await through_elections("fake", intake.bind, limit_s=10)
    assert intake.binds == 1


async def test_a_bind_still_unanswered_at_the_limit_says_so():
    intake = _Intake(*[nats.errors.TimeoutError()] * 10)
    with pytest.raises(RuntimeError, match="elected no leader for 1 s"):
        await through_elections("fake", intake.bind, limit_s=1)
    assert 2 <= intake.binds <= 4  # 0.25 + 0.5 + the rest of the second


def test_only_timeouts_and_503_are_taken_for_an_election():
    assert jetstream_busy(nats.errors.TimeoutError())
    assert jetstream_busy(asyncio.TimeoutError())
    assert jetstream_busy(ServiceUnavailableError(code=503, err_code=10008))
    assert not jetstream_busy(ServiceUnavailableError())  # nats-py's no responders: no JetStream
    assert not jetstream_busy(ServiceUnavailableError(code=503, err_code=10039))  # account
    assert not jetstream_busy(NotFoundError(code=404))
    assert not jetstream_busy(nats.errors.NoRespondersError())
    assert not jetstream_busy(RuntimeError("must use the same --queue"))


@pytest.mark.parametrize("subject, ok", [
    ("client.replies.7", True), ("_INBOX.abc", True), ("a", True),
    ("", False), ("audit.s x", False), ("a\tb", False), ("a..b", False), (".a", False),
    ("a.", False), ("audit.w.*", False), ("a.>", False), ("*", False),
])
def test_only_a_subject_a_reply_can_be_published_to_is_a_reply_subject(subject, ok):
    from poolwire.actors.durable_policy import publishable

    assert publishable(subject) is ok
