"""The benchmarks, run from a checkout (`python bench/<name>.py`, or `python -m bench.<name>` in
a child process): they import `bench.*` from the checkout's root, which is on sys.path for that."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checkout_after_installed_packages() -> None:
    """Move this checkout's root from the front of sys.path to its end. The root holds
    actors/, kernels/, models/ and schemas/ (installed as poolwire.*), and in front they shadow
    installed packages of those names: Hugging Face's `kernels`, which transformers imports
    since 5.25, failed every import of sentence_transformers. At the end the root still
    serves `bench.*` and `tests.*`, which nothing installed provides."""
    kept = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    if len(kept) != len(sys.path):
        sys.path[:] = kept + [str(ROOT)]


checkout_after_installed_packages()
