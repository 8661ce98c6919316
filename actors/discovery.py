"""NATS micro-service discovery for a worker (PROTOCOL.md "Discovery"): `$SRV.PING`, `$SRV.INFO`
and `$SRV.STATS` (all, by name, by id) answered in the micro v1 JSON schema.

The request endpoint itself is the IngestActor's own subscription, not a `nats.micro`
endpoint: micro awaits its handler inline per message and `stop()` unsubscribes instead of
draining (NATS.md section 3), while ours hands off to a mailbox and drains on stop."""

import json
import uuid
from datetime import datetime, timezone
from typing import Callable

SERVICE_NAME = "poolwire"
VERBS = ("PING", "INFO", "STATS")


class Discovery:
    def __init__(self, nc, version: str, description: str, metadata: dict[str, str],
                 endpoint: dict[str, str], stats: Callable[[], dict]) -> None:
        self._nc = nc
        self.id = uuid.uuid4().hex  # subject-safe, unlike host names
        self._version = version
        self._description = description
        self._metadata = metadata
        self._endpoint = endpoint      # {"name", "subject", "queue_group"}
        self._stats = stats            # -> {"num_requests", "num_errors", "data", ...}
        self._started = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        self._subs = []

    def _base(self, kind: str) -> dict:
        return {"type": f"io.nats.micro.v1.{kind}_response", "name": SERVICE_NAME, "id": self.id,
                "version": self._version, "metadata": self._metadata}

    def response(self, verb: str) -> dict:
        if verb == "PING":
            return self._base("ping")
        if verb == "INFO":
            return {**self._base("info"), "description": self._description,
                    "endpoints": [{**self._endpoint, "metadata": None}]}
        return {**self._base("stats"), "started": self._started,
                "endpoints": [{**self._endpoint, **self._stats()}]}

    async def start(self) -> None:
        for verb in VERBS:
            async def answer(msg, verb=verb):
                if msg.reply:
                    await self._nc.publish(msg.reply, json.dumps(self.response(verb)).encode())
            for subject in (f"$SRV.{verb}", f"$SRV.{verb}.{SERVICE_NAME}",
                            f"$SRV.{verb}.{SERVICE_NAME}.{self.id}"):
                self._subs.append(await self._nc.subscribe(subject, cb=answer))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
