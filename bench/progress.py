"""The benchmark's progress lines: on stderr, so that stdout carries the table alone."""

import sys


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
