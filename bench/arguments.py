"""Argument types the benchmarks share."""

import argparse


def count(raw: str) -> int:
    """An argparse type for a count of texts, requests, rounds or processes: 1 or more. argparse
    names the option in its error ("argument --rounds: must be at least 1, got 0")."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
