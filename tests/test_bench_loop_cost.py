"""bench/loop_cost.py: one tiny run end to end (the actor graph in-process on a stand-in
connection, the bare responder through a real nats-server), every reply checked on both sides.
Never asserts on speed."""

import pytest

from bench import loop_cost
from tests.helpers import usage_error


def test_a_bad_scale_names_the_value(capsys):
    assert "--scale must be above 0" in usage_error(loop_cost.main, ["--scale", "0"], capsys)


@pytest.mark.timeout(300)
def test_a_tiny_run_answers_every_request_on_both_sides(capsys):
    rc = loop_cost.main(["--scale", "0.05", "--rounds", "2"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "Errors: bare 0, path 0" in text
    row = next(line for line in text.splitlines() if line.startswith("| requests/s |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    bare, path, ratio = (float(cells[i].replace(",", "").rstrip("x")) for i in (1, 2, 3))
    assert bare > 0 and path > 0 and ratio == pytest.approx(path / bare, abs=0.006)  # 2 decimals
    assert "CPU: " in text and "flags" in text


def test_the_stand_in_keeps_every_reply_and_says_when_all_are_in():
    import asyncio

    async def go():
        nc = loop_cost.StandIn()
        nc.expected = 2
        await nc.publish("a", b"1")
        assert not nc.all_in.is_set()
        await nc.publish("b", b"2", headers={"x": "y"})
        assert nc.all_in.is_set() and nc.replies == {"a": (b"1", None), "b": (b"2", {"x": "y"})}

    asyncio.run(go())
