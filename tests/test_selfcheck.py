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


def looked(check: SelfCheck, start: float, until: float, link: Link = Link.CONNECTED):
    """Ask for a verdict every 0.25 s from `start` to `until`, as the watchdog does; return the
    first verdict that acts, with its time, or the last one."""
    t = start
    while t <= until + 1e-9:
        v = check.verdict(link, t)
        if v.action is not Action.NONE:
            return v, t
        t += 0.25
    return v, until


def test_a_connected_worker_whose_probes_stop_coming_back_reconnects_then_exits():
    check = SelfCheck(interval_s=1, timeout_s=3, max_reconnects=2)
    probe_round(check, 0.0)
    check.next_probe(1.0)                      # lost
    v, t = looked(check, 1.0, 5.0)
    assert v.action is Action.RECONNECT and t == 4.0 and not v.healthy and "deaf" in v.reason
    check.link_changed(Link.RECONNECTING, 4.0)
    check.link_changed(Link.CONNECTED, 4.25)
    check.next_probe(4.25)                     # lost again after the reconnect
    v, t = looked(check, 4.25, 8.0)
    assert v.action is Action.RECONNECT and t == 7.25
    check.next_probe(7.5)
    v, t = looked(check, 7.5, 11.0)
    assert v.action is Action.EXIT and t == 10.5 and "even after 2 reconnects" in v.reason


def test_a_probe_back_after_a_forced_reconnect_resets_the_count():
    check = SelfCheck(interval_s=1, timeout_s=3, max_reconnects=1)
    check.next_probe(0.0)
    assert looked(check, 0.0, 3.0)[0].action is Action.RECONNECT
    probe_round(check, 3.5)                    # the reconnect cured it
    check.next_probe(5.0)
    assert looked(check, 3.25, 8.0)[0].action is Action.RECONNECT  # not EXIT


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


def test_a_late_probe_while_messages_keep_arriving_is_busy_not_deaf():
    check = SelfCheck(interval_s=1, timeout_s=3, busy_limit_s=30)
    check.received(0, 0.0)
    check.next_probe(0.0)                      # stuck behind a burst in the socket
    for t in range(1, 30):
        check.received(t * 1000, float(t))     # the read loop works through the burst
        v = check.verdict(Link.CONNECTED, float(t))
        assert v.action is Action.NONE and v.healthy, v
    assert "busy" in v.reason
    check.received(31000, 30.0)
    assert check.verdict(Link.CONNECTED, 30.0).action is Action.RECONNECT  # beyond the limit


def test_a_late_probe_with_nothing_else_arriving_is_deaf():
    check = SelfCheck(interval_s=1, timeout_s=3)
    check.received(500, 0.0)
    check.next_probe(0.0)
    check.received(500, 2.0)                   # nothing read since: the receive path is stuck
    assert check.verdict(Link.CONNECTED, 3.0).action is Action.RECONNECT


def test_a_stalled_process_does_not_count_the_stall_against_its_probes():
    check = SelfCheck(interval_s=1, timeout_s=3)
    check.next_probe(0.0)
    assert check.verdict(Link.CONNECTED, 0.25).action is Action.NONE
    # The event loop was blocked for 5 s: the probe waits unread in the socket.
    assert check.verdict(Link.CONNECTED, 5.25).action is Action.NONE
    check.answered(0, 5.3)
    assert check.verdict(Link.CONNECTED, 5.5).healthy
