"""The worker's threads carry names that tell their roles to top -H, py-spy and
bench/service_cost.py's CPU split: here, the Rust tokenizers' thread pool, which
`poolwire serve` has made from a thread named as the tokenize thread
(actors/engine.py: start_tokenizer_pool). In a process of its own: the pool is made once a
process, and this one runs with TOKENIZERS_PARALLELISM=false (conftest.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # where `bench` imports from

PROGRAM = textwrap.dedent("""
    import json, os, sys
    from tokenizers import Tokenizer, models
    from bench.service_cost import threads_cpu  # what the CPU split reads: {tid: (name, cpu)}
    from poolwire.actors.engine import start_tokenizer_pool

    before = threads_cpu(os.getpid())
    if sys.argv[1] == "named":
        start_tokenizer_pool()
    # A batch call from the main thread, as the backend's start-up check makes: it makes the
    # pool where start_tokenizer_pool did not, and uses the pool it made where it did.
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).encode_batch(["a", "b", "c"])
    after = threads_cpu(os.getpid())
    print(json.dumps(sorted(name for tid, (name, _) in after.items() if tid not in before)))
""")


def _new_thread_names(mode: str) -> list[str]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tokenizer_pool_is_named_as_the_tokenize_thread():
    made = _new_thread_names("named")
    assert made, "no pool threads were made"
    assert set(made) == {"poolwire-tokeni"}  # comm keeps 15 characters


def test_without_it_the_pool_takes_the_process_name():
    """The control: what the split read before, every pool thread named after the process."""
    made = _new_thread_names("plain")
    assert made and "poolwire-tokeni" not in made
