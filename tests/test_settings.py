"""One settings object: defaults, POOLWIRE_* and NATS_URL from the environment, CLI values on
top, and clear refusals."""

import pytest
from pydantic import ValidationError

from actors.cli import SERVE_KEYS, build_parser
from actors.settings import WorkerSettings


def test_environment_overrides_defaults_and_explicit_values_override_the_environment():
    env = {"POOLWIRE_TASK": "token_embed", "POOLWIRE_MAX_BATCH_SIZE": "8", "NATS_URL": "nats://h:1",
           "POOLWIRE_MULTITASK": "reject"}
    s = WorkerSettings.from_env(env)
    assert (s.task, s.max_batch_size, s.nats_url, s.multitask) == ("token_embed", 8, "nats://h:1", "reject")
    assert WorkerSettings.from_env(env, task="embed", max_batch_size=None).task == "embed"
    assert WorkerSettings.from_env({"POOLWIRE_NATS_URL": "nats://a:2", "NATS_URL": "nats://b:3"}).nats_url == "nats://a:2"


def test_bad_values_are_refused_naming_the_field():
    with pytest.raises(ValidationError, match="multitask"):
        WorkerSettings.from_env({"POOLWIRE_MULTITASK": "maybe"})
    with pytest.raises(ValidationError, match="max_batch_tokens"):
        WorkerSettings.from_env({"POOLWIRE_MAX_BATCH_TOKENS": "0"})


def test_every_serve_option_is_a_setting_and_an_environment_variable():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    options = {a.dest for a in serve._actions if a.dest != "help"}
    assert options == set(SERVE_KEYS)
    assert set(SERVE_KEYS) <= set(WorkerSettings.model_fields)
    assert WorkerSettings.env_name("max_wait_ms") == "POOLWIRE_MAX_WAIT_MS"


def test_serve_refuses_a_missing_model_folder_with_a_clear_message(tmp_path, capsys):
    from actors.cli import main

    assert main(["serve", "--model", str(tmp_path / "nope"), "--nats-port", "-1",
                 "--state-dir", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err
