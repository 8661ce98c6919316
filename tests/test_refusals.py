"""poolwire.refusals alone: which server errors fail which waiting requests (the e2e side is
tests/test_creds_jwt_e2e.py, against an operator-mode nats-server)."""

import asyncio

import pytest

from poolwire.refusals import PermissionRefusedError, Refusals, parse_violation, watch

# nats-py lowercases the server's -ERR text before error_cb sees it.
PUBLISH = 'nats: permissions violation for publish to "p.classify"'
SUBSCRIBE = 'nats: permissions violation for subscription to "_inbox.app.x7k.*"'


def test_parse_violation():
    assert parse_violation(PUBLISH) == ("publish", "p.classify")
    assert parse_violation("Permissions Violation for Subscription to \"_INBOX.A.>\"") == (
        "subscription", "_inbox.a.>")
    assert parse_violation("nats: 'Authorization Violation'") is None
    assert parse_violation("nats: maximum payload violation") is None


async def never():
    await asyncio.Event().wait()


async def test_a_refused_publish_fails_the_requests_to_that_subject_only():
    refusals = Refusals()
    with refusals.watch("P.classify") as classify, refusals.watch("P.embed") as embed:
        assert refusals.notify(PUBLISH)
        with pytest.raises(PermissionRefusedError, match="publishing to 'P.classify'"):
            await asyncio.wait_for(classify.race(never()), 1)
        assert await embed.race(asyncio.sleep(0, "answered")) == "answered"
    assert not refusals.notify(PUBLISH)  # nothing waits any more: the caller logs it instead


async def test_an_answer_that_came_first_wins():
    refusals = Refusals()
    with refusals.watch("P.classify") as w:
        assert await w.race(asyncio.sleep(0, "reply")) == "reply"
        refusals.notify(PUBLISH)  # a late error for another request of this subject


async def test_a_refused_reply_subscription_fails_now_and_every_later_request():
    refusals = Refusals("_INBOX.app")
    assert not refusals.notify('nats: permissions violation for subscription to "other.>"')
    with refusals.watch("P.embed") as w:
        assert refusals.notify(SUBSCRIBE)
        with pytest.raises(PermissionRefusedError, match="--nats-inbox-prefix"):
            await asyncio.wait_for(w.race(never()), 1)
    with pytest.raises(PermissionRefusedError, match="'_INBOX.app'"):
        with refusals.watch("P.embed"):
            pass


async def test_a_connection_without_refusals_just_waits():
    class PlainClient:  # a nats-py connection the caller made itself
        pass

    with watch(PlainClient(), "P.embed") as w:
        assert await w.race(asyncio.sleep(0, "reply")) == "reply"
