"""`report`: a fixture that prints the figures a failure test measured, one line each
(`pytest -s` shows them), for RELIABILITY.md."""

import pytest


@pytest.fixture
def report(request):
    def _report(what: str, **figures) -> None:
        values = ", ".join(f"{k}={v}" for k, v in figures.items())
        print(f"\nFIGURES {request.node.name}: {what}: {values}")
    return _report
