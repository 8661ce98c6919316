"""One task per queue group: a worker refuses to join a prefix and queue group where another
worker serves a different model or configured task. NATS splits a queue group's traffic blindly,
so two such workers would each refuse or mis-serve part of every client's requests (measured:
21 of 40 embed requests refused, 15 of 40 token_embed requests answered with deprecation
warnings, and nothing told anyone).

`conflicts` decides (pure); `discover_workers` asks the running workers through discovery
($SRV.INFO.poolwire, which every worker answers, NATS.md section 3)."""

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from poolwire.actors.discovery import SERVICE_NAME

log = logging.getLogger(__name__)


class QueueConflictError(Exception):
    """Another worker in this prefix and queue group serves a different model or task."""


@dataclass(frozen=True)
class Member:
    """What a worker in a queue group serves, as its discovery INFO says."""

    worker: str
    model: str
    configured_task: str
    prefix: str
    queue: str


def member_from_info(info: dict[str, Any]) -> Member | None:
    """A Member from an INFO answer, or None when it is not a poolwire worker's. Prefix and
    queue come from the metadata, or from the endpoint (`P.*`, queue_group) for workers that
    predate those metadata keys."""
    if not isinstance(info, dict) or info.get("name") != SERVICE_NAME:
        return None
    meta = info.get("metadata") or {}
    endpoints = info.get("endpoints") or [{}]
    endpoint = endpoints[0] if isinstance(endpoints[0], dict) else {}
    prefix = meta.get("prefix") or str(endpoint.get("subject", "")).removesuffix(".*")
    queue = meta.get("queue") or endpoint.get("queue_group")
    if not (prefix and queue and meta.get("model") and meta.get("configured_task")):
        return None
    return Member(worker=meta.get("worker") or str(info.get("id", "?")), model=meta["model"],
                  configured_task=meta["configured_task"], prefix=prefix, queue=queue)


def conflicts(me: Member, others: Iterable[Member]) -> list[Member]:
    """The workers in my prefix and queue group that serve another model or configured task."""
    return [o for o in others
            if o.worker != me.worker and (o.prefix, o.queue) == (me.prefix, me.queue)
            and (o.model, o.configured_task) != (me.model, me.configured_task)]


def conflict_message(me: Member, others: list[Member]) -> str:
    named = "; ".join(f"worker {o.worker} serves {o.model} (task {o.configured_task})"
                      for o in others)
    return (f"refusing to join queue group {me.queue!r} on {me.prefix}.*: {named}, and this "
            f"worker would serve {me.model} (task {me.configured_task}), so NATS would split "
            f"requests between them and part of them would be refused or mis-served. Use another "
            f"--prefix or --queue for this model/task, or pass --allow-mixed-queue true "
            f"(POOLWIRE_ALLOW_MIXED_QUEUE=true) to start anyway")


async def discover_workers(nc, idle_s: float = 0.25, limit_s: float = 3.0) -> list[dict]:
    """Every INFO answer from the poolwire workers on this NATS: publish with a reply inbox and
    read until no answer came for `idle_s` (nc.request would return only the first). With no
    worker at all, the server's no-responders status ends the wait at once."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    answers: list[dict] = []
    deadline = asyncio.get_running_loop().time() + limit_s
    try:
        await nc.publish(f"$SRV.INFO.{SERVICE_NAME}", b"", reply=inbox)
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return answers
            try:
                msg = await sub.next_msg(timeout=min(idle_s, left))
            except asyncio.TimeoutError:
                return answers  # quiet for idle_s: every worker has answered
            if msg.headers and msg.headers.get("Status") == "503":
                return answers  # no responders: no poolwire worker on this server
            try:
                answers.append(json.loads(msg.data))
            except ValueError:
                log.warning("ignoring an INFO answer that is not JSON: %r", msg.data[:80])
    finally:
        await sub.unsubscribe()


async def ensure_alone_or_alike(nc, me: Member) -> None:
    """Raise QueueConflictError naming every worker that would share my queue group while
    serving another model or task. Two workers starting at the same instant can both pass:
    this guards against the common mistake, not against a race."""
    members = [m for m in map(member_from_info, await discover_workers(nc)) if m is not None]
    found = conflicts(me, members)
    if found:
        raise QueueConflictError(conflict_message(me, found))
