"""The self-check's decision alone (actors/selfcheck.py): when a worker is deaf, and what it
does about it, on a clock the test moves by hand."""

from poolwire.actors.selfcheck import Action, Link, SelfCheck


def probe_round(check: SelfCheck, now: float, back_after: float | None = 0.01) -> int | None:
    seq = check.next_probe(now)
    if seq is not None and back_after is not None:
        check.answered(seq, now + back_after)
    return seq


def test_probes_that_come_back_keep_the_worker_healthy():
    check = SelfCheck(interval_s=1, timeout_s=3)
    assert check.verdict(Link.CONNECTED, 0.5).healthy  # within the first timeout
    for t in range(10):
        assert probe_round(check, float(t)) is not None
        v = check.verdict(Link.CONNECTED, t + 0.5)
        assert (v.action, v.healthy) == (Action.NONE, True), v
    assert "ok" in v.reason


def test_one_probe_per_interval_while_one_is_out():
    check = SelfCheck(interval_s=1, timeout_s=3)
    assert check.next_probe(0.0) == 0
    assert check.next_probe(0.5) is None
    assert check.next_probe(1.0) == 1


def test_a_connected_worker_whose_probes_stop_coming_back_reconnects_then_exits():
    check = SelfCheck(interval_s=1, timeout_s=3, max_reconnects=2)
    probe_round(check, 0.0)
    check.next_probe(1.0)                      # lost
    assert check.verdict(Link.CONNECTED, 3.9).action is Action.NONE
    v = check.verdict(Link.CONNECTED, 4.0)     # 3 s after the lost probe
    assert v.action is Action.RECONNECT and not v.healthy and "deaf" in v.reason
    check.link_changed(Link.RECONNECTING, 4.0)
    check.link_changed(Link.CONNECTED, 4.1)
    check.next_probe(4.1)                      # lost again after the reconnect
    assert check.verdict(Link.CONNECTED, 7.1).action is Action.RECONNECT
    check.next_probe(7.2)
    v = check.verdict(Link.CONNECTED, 10.3)
    assert v.action is Action.EXIT and "even after 2 reconnects" in v.reason


def test_a_probe_back_after_a_forced_reconnect_resets_the_count():
    check = SelfCheck(interval_s=1, timeout_s=3, max_reconnects=1)
    check.next_probe(0.0)
    assert check.verdict(Link.CONNECTED, 3.0).action is Action.RECONNECT
    probe_round(check, 3.5)                    # the reconnect cured it
    check.next_probe(5.0)
    assert check.verdict(Link.CONNECTED, 8.0).action is Action.RECONNECT  # not EXIT


def test_while_disconnected_nothing_is_forced_and_the_outage_is_reported():
    check = SelfCheck(interval_s=1, timeout_s=3)
    probe_round(check, 0.0)
    check.next_probe(1.0)
    check.link_changed(Link.RECONNECTING, 1.5)  # the server went away: that probe is lost
    v = check.verdict(Link.RECONNECTING, 60.0)
    assert v.action is Action.NONE and not v.healthy
    assert "disconnected from NATS for 58.5 s" in v.reason
    check.link_changed(Link.CONNECTED, 61.0)
    assert check.verdict(Link.CONNECTED, 61.5).action is Action.NONE  # old probe forgotten


def test_a_connection_closed_for_good_is_fatal():
    v = SelfCheck().verdict(Link.CLOSED, 1.0)
    assert v.action is Action.EXIT and "closed for good" in v.reason


def test_stale_and_foreign_answers_prove_nothing():
    check = SelfCheck(interval_s=1, timeout_s=3)
    seq = check.next_probe(0.0)
    check.answered(seq + 100, 0.1)             # never sent
    check.link_changed(Link.RECONNECTING, 0.2)
    check.link_changed(Link.CONNECTED, 0.3)
    check.answered(seq, 0.4)                   # sent before the reconnect
    assert check.last_ok is None


def test_no_first_probe_back_is_deaf():
    check = SelfCheck(interval_s=1, timeout_s=3, started_at=0.0)
    check.next_probe(0.0)
    v = check.verdict(Link.CONNECTED, 2.0)
    assert v.healthy and "first" in v.reason
    assert check.verdict(Link.CONNECTED, 3.0).action is Action.RECONNECT
