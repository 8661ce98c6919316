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


async def waiting_request(refusals: Refusals, subject: str, reply: asyncio.Future):
    """A request to `subject` waiting for `reply`, as PoolingClient waits for nc.request."""
    with refusals.watch(subject):
        return await reply


async def test_a_refused_publish_fails_the_requests_to_that_subject_only():
    refusals = Refusals()
    loop = asyncio.get_running_loop()
    classify_reply, embed_reply = loop.create_future(), loop.create_future()
    classify = asyncio.create_task(waiting_request(refusals, "P.classify", classify_reply))
    embed = asyncio.create_task(waiting_request(refusals, "P.embed", embed_reply))
    await asyncio.sleep(0)  # both are waiting now
    assert refusals.notify(PUBLISH)
    with pytest.raises(PermissionRefusedError, match="publishing to 'P.classify'"):
        await asyncio.wait_for(classify, 1)
    assert not embed.done()
    embed_reply.set_result("answered")
    assert await embed == "answered"
    assert not refusals.notify(PUBLISH)  # nothing waits any more: the caller logs it instead


async def test_cancelling_a_watched_request_is_still_a_cancellation():
    refusals = Refusals()
    request = asyncio.create_task(
        waiting_request(refusals, "P.embed", asyncio.get_running_loop().create_future()))
    await asyncio.sleep(0)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert not refusals.notify('nats: permissions violation for publish to "p.embed"')


async def test_a_refused_reply_subscription_fails_now_and_every_later_request():
    refusals = Refusals("_INBOX.app")
    assert not refusals.notify('nats: permissions violation for subscription to "other.>"')
    request = asyncio.create_task(
        waiting_request(refusals, "P.embed", asyncio.get_running_loop().create_future()))
    await asyncio.sleep(0)
    assert refusals.notify(SUBSCRIBE)
    with pytest.raises(PermissionRefusedError, match="--nats-inbox-prefix"):
        await asyncio.wait_for(request, 1)
    with pytest.raises(PermissionRefusedError, match="'_INBOX.app'"):
        with refusals.watch("P.embed"):
            pass


async def test_a_connection_without_refusals_just_waits():
    class PlainClient:  # a nats-py connection the caller made itself
        pass

    with watch(PlainClient(), "P.embed"):
        assert await asyncio.sleep(0, "reply") == "reply"
