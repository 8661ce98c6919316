"""PoolerConfig and vLLM's option names: the worker's task-policy settings are PoolerConfig's
fields, --pooler-config.task / --pooler-config JSON / POOLWIRE_POOLER_CONFIG are aliases of
--task & co., and a value given both ways that disagrees is refused at start in one line."""

import asyncio
import os
import signal
import subprocess
import sys

import pytest
from pydantic import ValidationError

from poolwire.cli import main
from poolwire.pooler_config import PoolerConfig
from poolwire.settings import WorkerSettings
from tests.test_cli_serve import read_until
from tests.test_settings import settings_from


def test_worker_settings_have_exactly_pooler_configs_fields_with_the_same_meaning():
    pooler = PoolerConfig.model_fields
    worker = WorkerSettings.model_fields
    assert set(pooler) <= set(worker)
    assert set(worker["pooler_config"].annotation.model_fields) == set(pooler)
    for name, field in pooler.items():
        mine = worker[name]
        # CliImplicitFlag[bool] is bool with a marker for the CLI (--flag / --no-flag).
        marks = [m for m in mine.metadata if not (isinstance(m, type) and "CliImplicitFlag" in m.__name__)]
        assert (mine.default, mine.description, marks, mine.annotation) == \
            (field.default, field.description, field.metadata, field.annotation), name


def test_vllm_names_set_the_same_settings():
    s = settings_from(["serve", "--pooler-config.task", "token_embed"])
    assert (s.task, s.pooler_config.task) == ("token_embed", "token_embed")
    s = settings_from(["serve", "--pooler-config", '{"task": "embed", "multitask": "reject", '
                                                   '"chunked_processing": true, "max_embed_len": 900}'])
    assert (s.task, s.multitask, s.chunked_processing, s.max_embed_len) == ("embed", "reject", True, 900)
    assert s.pooler_config == PoolerConfig(task="embed", multitask="reject",
                                           chunked_processing=True, max_embed_len=900)
    s = settings_from(["serve", "--chunked-processing", "--max-embed-len", "600"])
    assert s.pooler_config == PoolerConfig(chunked_processing=True, max_embed_len=600)
    # vLLM's own key for chunking is understood, in the JSON and offline.
    s = settings_from(["serve", "--pooler-config", '{"enable_chunked_processing": true, "max_embed_len": 4096}'])
    assert (s.chunked_processing, s.max_embed_len) == (True, 4096)
    assert PoolerConfig(enable_chunked_processing=True) == PoolerConfig(chunked_processing=True)
    with pytest.raises(ValidationError, match="enable_chunked_processing True and chunked_processing False disagree"):
        PoolerConfig(enable_chunked_processing=True, chunked_processing=False)
    # The same value both ways is no conflict.
    assert settings_from(["serve", "--task", "embed", "--pooler-config.task", "embed"]).task == "embed"


def test_serve_help_shows_the_vllm_names():
    from poolwire.cli import build_parser

    parser, _ = build_parser()
    text = parser._subparsers._group_actions[0].choices["serve"].format_help()
    for flag in ("--pooler-config.task", "--pooler-config.multitask", "--pooler-config.max-embed-len",
                 "--pooler-config.chunked-processing", "--pooler-config [JSON]", "POOLWIRE_POOLER_CONFIG",
                 "--chunked-processing", "--max-embed-len"):
        assert flag in text, flag


def test_the_environment_variable_is_an_alias_too(monkeypatch):
    monkeypatch.setenv("POOLWIRE_POOLER_CONFIG", '{"task": "token_embed"}')
    assert WorkerSettings().task == "token_embed"
    monkeypatch.setenv("POOLWIRE_TASK", "embed")
    with pytest.raises(ValidationError, match="--task embed .*conflicts with --pooler-config.task token_embed"):
        WorkerSettings()


def test_bad_pooler_configs_are_refused_naming_the_value():
    with pytest.raises(ValidationError, match="has no tsk: its keys are task, multitask"):
        settings_from(["serve", "--pooler-config", '{"tsk": "embed"}'])
    with pytest.raises(ValidationError, match=r"--pooler-config \[1, 2\] is not a JSON object"):
        settings_from(["serve", "--pooler-config", "[1, 2]"])
    with pytest.raises(ValidationError, match="--max-embed-len 600 .*conflicts with --pooler-config.max-embed-len 700"):
        settings_from(["serve", "--chunked-processing", "--max-embed-len", "600",
                       "--pooler-config.max-embed-len", "700"])
    with pytest.raises(ValidationError, match="max_embed_len 900 applies only with chunked processing"):
        settings_from(["serve", "--max-embed-len", "900"])
    with pytest.raises(ValidationError, match="max_embed_len 900 applies only with chunked processing"):
        PoolerConfig(max_embed_len=900)
    with pytest.raises(ValueError, match="max_embed_len 100 is below the model's maximum length 256"):
        PoolerConfig(chunked_processing=True, max_embed_len=100).embed_limit(256)
    assert PoolerConfig(chunked_processing=True).embed_limit(256) == 2048
    assert PoolerConfig().embed_limit(256) is None


def test_a_conflict_is_one_line_at_start_with_the_exit_code_of_other_start_up_errors(capsys):
    assert main(["serve", "--task", "embed", "--pooler-config.task", "classify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--task embed" in err and "--pooler-config.task classify" in err
    assert main(["serve", "--multitask", "warn", "--pooler-config", '{"multitask": "reject"}']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--multitask warn" in err and "reject" in err


@pytest.mark.timeout(180)
def test_a_max_embed_len_below_the_models_maximum_fails_start_up(tmp_path, capsys):
    assert main(["serve", "--chunked-processing", "--max-embed-len", "100", "--nats-port", "-1",
                 "--state-dir", str(tmp_path)]) == 2
    assert "max_embed_len 100 is below the model's maximum length 256" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_pooler_config_task_starts_a_worker_on_that_task(tmp_path):
    env = {**os.environ, "POOLWIRE_STATE_DIR": str(tmp_path), "POOLWIRE_PREFIX": "pc.pooling",
           "HF_HUB_OFFLINE": "1"}
    env.pop("NATS_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "poolwire", "serve", "--nats-port", "-1",
        "--pooler-config.task", "token_embed", "--max-added-padding", "16",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        await read_until(proc.stdout, r"configured task token_embed; supported tasks embed, "
                                      r"token_embed, score; multitask warn")
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
