"""The task policy as pure functions: the supported-task table, the configured-task rule and
the verdict for each requested task (PROTOCOL.md "Task policy")."""

import pytest

from poolwire.actors.task_policy import (TaskConfigError, TaskPolicy, Verdict, configured_task,
                                score_task, score_uses_configured_task, supported_tasks)
from poolwire.schemas.tasks import Task, parse_task

E, C, S, TE, TC = Task.EMBED, Task.CLASSIFY, Task.SCORE, Task.TOKEN_EMBED, Task.TOKEN_CLASSIFY


def test_a_subject_token_names_a_task_by_its_wire_name_only():
    assert [parse_task(t.value) for t in Task] == list(Task)
    assert parse_task(Task.SCORE) is Task.SCORE  # a member is its own task
    for other in ("EMBED", "Embed", "embed ", "", "rerank", None, 3, ["embed"]):
        assert parse_task(other) is None


@pytest.mark.parametrize("kind, labels, per_token, expected", [
    ("encoder", 0, True, [E, TE, S]),
    ("sequence_classification", 3, True, [C, TC]),
    ("sequence_classification", 1, True, [C, TC, S]),     # one label: a cross-encoder
    ("sequence_classification", 3, False, [C]),          # a head that cannot run per token
    ("token_classification", 5, True, [TC]),
])
def test_supported_tasks_by_model_kind_in_protocol_order(kind, labels, per_token, expected):
    assert supported_tasks(kind, labels, per_token) == expected


@pytest.mark.parametrize("architecture, supported, asked, expected", [
    ("BertModel", [E, TE, S], None, E),
    ("BertForSequenceClassification", [C, TC], None, C),
    ("BertForSequenceClassification", [C, TC, S], None, C),
    ("BertForTokenClassification", [TC], None, TC),
    # The token-classifier rule comes before the priority list, whatever else is supported.
    ("FancyForTokenClassification", [E, TC], None, TC),
    ("BertModel", [E, TE, S], "token_embed", TE),
])
def test_configured_task_rule(architecture, supported, asked, expected):
    assert configured_task(architecture, supported, asked) is expected


@pytest.mark.parametrize("architecture, supported, configurable", [
    ("BertModel", [E, TE, S], "embed, token_embed"),
    ("BertForSequenceClassification", [C, TC, S], "classify, token_classify"),
])
def test_score_is_never_a_configured_task(architecture, supported, configurable):
    """vLLM PR #37537: score is served with embed or classify, never configured itself."""
    with pytest.raises(TaskConfigError, match=f"PR #37537.*configured for: {configurable}$"):
        configured_task(architecture, supported, "score")


@pytest.mark.parametrize("asked", ["classify", "summarize"])
def test_a_task_the_model_cannot_do_fails_listing_every_supported_task(asked):
    with pytest.raises(TaskConfigError) as info:
        configured_task("BertModel", [E, TE, S], asked)
    assert "embed, token_embed, score" in str(info.value) and asked in str(info.value)


def test_verdicts_for_warn_and_reject():
    warn = TaskPolicy(E, (E, TE, S), "warn", score_with_configured=True)
    reject = TaskPolicy(E, (E, TE, S), "reject", score_with_configured=True)
    assert [warn.judge(t) for t in (E, S, TE, C, None)] == [
        Verdict.SERVE, Verdict.SERVE, Verdict.DEPRECATED, Verdict.UNSUPPORTED, Verdict.UNSUPPORTED]
    assert reject.judge(TE) == Verdict.NOT_CONFIGURED and reject.judge(S) == Verdict.SERVE


def test_score_counts_as_the_configured_task_only_when_computed_with_it():
    assert score_uses_configured_task("encoder", 0, E)
    # PROTOCOL 1.2: a token_embed deployment scores by late interaction (MaxSim), not deprecated.
    assert score_uses_configured_task("encoder", 0, TE)
    assert score_uses_configured_task("sparse", 0, E)
    assert score_uses_configured_task("sequence_classification", 1, C)
    assert not score_uses_configured_task("sequence_classification", 1, TC)
    policy = TaskPolicy(TC, (C, TC, S), "warn", score_with_configured=False)
    assert policy.judge(S) == Verdict.DEPRECATED


def test_the_worker_to_start_for_a_deprecated_score_is_the_task_it_is_computed_with():
    # `--task score` is refused at start, so a hint must name embed or classify instead.
    assert score_task("encoder") is E and score_task("sequence_classification") is C
    on_token_embed = TaskPolicy(TE, (E, TE, S), "warn", score_computed_with=E)
    assert on_token_embed.worker_task_for(S) is E
    assert on_token_embed.worker_task_for(E) is E
    cross_encoder = TaskPolicy(TC, (C, TC, S), "warn", score_computed_with=C)
    assert cross_encoder.worker_task_for(S) is C
    assert TaskPolicy(TC, (TC,), "warn").worker_task_for(TC) is TC
