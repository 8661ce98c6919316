"""One settings model: defaults, POOLWIRE_* and NATS_URL from the environment, `serve` options
on top (all derived by pydantic-settings from the same fields), and clear refusals."""

import pytest
from pydantic import ValidationError

from poolwire.cli import build_parser, main
from poolwire.settings import WorkerSettings


def settings_from(argv: list[str]) -> WorkerSettings:
    parser, serve_options = build_parser()
    return WorkerSettings(_cli_settings_source=serve_options(parsed_args=parser.parse_args(argv)))


def test_environment_overrides_defaults_and_options_override_the_environment(monkeypatch):
    for name, value in {"POOLWIRE_TASK": "token_embed", "POOLWIRE_MAX_BATCH_SIZE": "8",
                        "NATS_URL": "nats://h:1", "POOLWIRE_MULTITASK": "reject"}.items():
        monkeypatch.setenv(name, value)
    s = WorkerSettings()
    assert (s.task, s.max_batch_size, s.nats_url, s.multitask) == ("token_embed", 8, "nats://h:1", "reject")
    s = settings_from(["serve", "--task", "embed", "--max-wait-ms", "5"])
    assert (s.task, s.max_wait_ms, s.max_batch_size) == ("embed", 5.0, 8)
    monkeypatch.setenv("POOLWIRE_NATS_URL", "nats://a:2")
    assert WorkerSettings().nats_url == "nats://a:2"  # the specific name wins over NATS_URL


def test_bad_values_are_refused_naming_the_field(monkeypatch):
    monkeypatch.setenv("POOLWIRE_MULTITASK", "maybe")
    with pytest.raises(ValidationError, match="multitask"):
        WorkerSettings()
    monkeypatch.delenv("POOLWIRE_MULTITASK")
    monkeypatch.setenv("POOLWIRE_MAX_BATCH_TOKENS", "0")
    with pytest.raises(ValidationError, match="max_batch_tokens"):
        WorkerSettings()


def test_every_setting_is_a_serve_option_with_its_description():
    parser, _ = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    options = {a.option_strings[0]: a.help for a in serve._actions if a.dest != "help"}
    # A nested model's description heads its own group of options (--pooler-config.*).
    groups = {g.title: g.description for g in serve._action_groups}
    for name, field in WorkerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in options, flag
        assert field.description in (groups.get(f"{flag[2:]} options") or options[flag])
    assert WorkerSettings.env_name("max_wait_ms") == "POOLWIRE_MAX_WAIT_MS"


def test_serve_refuses_bad_options_and_a_missing_model_folder_with_one_line(tmp_path, capsys):
    assert main(["serve", "--max-batch-size", "0"]) == 2
    assert "max_batch_size" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path / "nope"), "--nats-port", "-1",
                 "--state-dir", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("fields, says", [
    ({"adapter": ["legal"]}, "NAME=DIR"),
    ({"adapter": ["a=/x", "a=/y"]}, "more than once"),
    ({"hybrid_weights": "1,2"}, "three weights"),
    ({"hybrid_weights": "0,0,0"}, "not all zero"),
    ({"score_method": "colbert"}, "score_method"),
])
def test_adapter_and_score_options_are_checked(fields, says):
    with pytest.raises(ValidationError, match=says):
        WorkerSettings(**fields)


def test_the_pooler_config_example_in_the_help_is_accepted():
    """`poolwire serve --help` shows a JSON object for --pooler-config: a user copies it, so it
    must be valid (it once named max_embed_len without chunked_processing, which is refused)."""
    import json
    import re

    description = WorkerSettings.model_fields["pooler_config"].description
    example = re.search(r"'(\{.*?\})'", description)
    assert example is not None, description
    settings = WorkerSettings(pooler_config=json.loads(example.group(1)))
    assert settings.pooler_config.max_embed_len == json.loads(example.group(1))["max_embed_len"]
