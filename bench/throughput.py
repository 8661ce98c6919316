"""Throughput and latency: in-process SentenceTransformer.encode against a poolwire worker over a
local nats-server, on one deterministic workload (the logic is actors/benchmark.py, which
`poolwire bench` runs too).

    .venv/bin/python bench/throughput.py            # the full table, a few minutes on 2 cores
    .venv/bin/python bench/throughput.py --quick    # a small run, to check that it works
    .venv/bin/python bench/throughput.py --help
"""

import sys
from pathlib import Path

# Run as a script, this file's folder heads sys.path; put the repository root there instead so
# `actors` imports from this checkout even where the package is not installed.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

from actors.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
