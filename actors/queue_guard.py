"""One task per queue group: a worker refuses to join a prefix and queue group where another
worker serves a different model or configured task. NATS splits a queue group's traffic blindly,
so two such workers would each refuse or mis-serve part of every client's requests (measured:
21 of 40 embed requests refused, 15 of 40 token_embed requests answered with deprecation
warnings, and nothing told anyone).

`conflicts` decides (pure); `ensure_alone_or_alike` asks the running workers through discovery
($SRV.INFO.poolwire, which every worker answers, NATS.md section 3)."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from poolwire.actors.discovery import SERVICE_NAME
from poolwire.operators import collect_answers
from poolwire.refusals import PermissionRefusedError

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


async def ensure_alone_or_alike(nc, me: Member) -> None:
    """Raise QueueConflictError naming every worker that would share my queue group while
    serving another model or task. Two workers starting at the same instant can both pass:
    this guards against the common mistake, not against a race."""
    # Quiet for 0.25 s after an answer: every worker has spoken (they answer within
    # milliseconds); with no worker at all the no-responders status ends the wait at once.
    try:
        answers = await collect_answers(nc, f"$SRV.INFO.{SERVICE_NAME}", idle=0.25, first=2.0)
    except PermissionRefusedError as exc:
        # The check is a courtesy, not the worker's job: a user without discovery rights still
        # serves (and its self-check says whether it can prove it receives).
        log.warning("could not check queue group %r for workers of another model: %s; "
                    "starting without the check", me.queue, exc)
        return
    members = [m for m in map(member_from_info, answers) if m is not None]
    found = conflicts(me, members)
    if found:
        raise QueueConflictError(conflict_message(me, found))
