"""The operator's commands: `poolwire stats` (every worker's $SRV.STATS as a table) and
`poolwire events` (stored deprecation events replayed, then new ones followed), and the
start-up hint a worker prints. The formatting and parsing pieces are pure and tested alone."""

import asyncio
import json
import re
import shlex
import sys
from datetime import datetime, timedelta, timezone

import msgpack

from poolwire.refusals import watch

SERVICE_NAME = "poolwire"  # the workers' NATS micro service name (actors/discovery.py)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: an RFC 3339 time (`2026-11-30T10:00:00Z`) or an age (`90s`, `10m`, `2h`, `1d`)."""
    if match := _DURATION.match(text.strip()):
        return now - timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: give an RFC 3339 time such as "
                         f"2026-11-30T10:00:00Z or an age such as 90s, 10m, 2h, 1d") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def try_hint(task: str, prefix: str, url: str) -> str:
    """A first request the worker will serve, with its real prefix and server URL."""
    body = {"token_classify": {"input": "Ada Lovelace was born in London"},
            "classify": {"input": "what a wonderful day"}}.get(task, {"input": "hello world"})
    raw = f"nats --server {shlex.quote(url)} req {prefix}.{task} {shlex.quote(json.dumps(body))}"
    common = f"--nats-url {shlex.quote(url)} --prefix {shlex.quote(prefix)}"
    if task in ("embed", "classify"):
        return f"poolwire {task} {common} {shlex.quote(body['input'])}   or   {raw}"
    return raw


STATS_COLUMNS = ("worker", "model", "task", "requests", "errors", "batches", "batch size",
                 "padding", "forward s", "cache hits", "last error")


def cache_hit_rate(data: dict) -> str:
    """`--cache-bucket` workers: the share of looked-up items served from the cache."""
    cache = data.get("cache")
    if not isinstance(cache, dict):
        return "-"
    looked = cache.get("hits", 0) + cache.get("misses", 0)
    return f"{cache.get('hits', 0) / looked:.0%}" if looked else "0%"


def _endpoints(answers: list[dict], prefix: str | None):
    """(worker, metadata, endpoint) of every STATS answer, keeping `prefix`'s workers only."""
    for answer in answers:
        meta = answer.get("metadata") or {}
        if prefix is not None and meta.get("prefix") != prefix:
            continue
        for endpoint in answer.get("endpoints") or []:
            yield meta.get("worker", answer.get("id", "?")), meta, endpoint


def stats_rows(answers: list[dict], prefix: str | None = None) -> list[tuple[str, ...]]:
    """One row per worker from $SRV.STATS answers, sorted by worker; `prefix` keeps one
    deployment's workers."""
    rows = []
    for worker, meta, endpoint in _endpoints(answers, prefix):
        data = endpoint.get("data") or {}
        rows.append((
            worker, meta.get("model", "?"),
            meta.get("configured_task", "?"), str(endpoint.get("num_requests", 0)),
            str(endpoint.get("num_errors", 0)), str(data.get("batches", 0)),
            f"{data.get('mean_batch_size', 0):.1f}", f"{data.get('padding_waste', 0):.0%}",
            f"{(data.get('seconds') or {}).get('forward', 0):.1f}", cache_hit_rate(data),
            endpoint.get("last_error") or "-"))
    return sorted(rows)


INTAKE_COLUMNS = ("worker", "intake", "jobs pending", "in progress", "redelivered",
                  "dead-lettered", "retried", "completed")


def intake_rows(answers: list[dict], prefix: str | None = None) -> list[tuple[str, ...]]:
    """One row per durable intake (`durable` jobs, `pipeline`) of each worker that runs one."""
    rows = []
    for worker, _, endpoint in _endpoints(answers, prefix):
        data = endpoint.get("data") or {}
        for intake in ("durable", "pipeline"):
            c = data.get(intake)
            if isinstance(c, dict):
                rows.append((worker, intake,
                             *(str(c.get(k, 0)) for k in ("pending", "in_progress", "redelivered",
                                                          "dead_lettered", "retried",
                                                          "completed"))))
    return sorted(rows)


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
             for line in (header, *rows)]
    return "\n".join(lines)


async def collect_answers(nc, subject: str, idle: float = 0.5, first: float = 2.0) -> list[dict]:
    """Publish once and gather every answer until none came for `idle` seconds: each worker
    answers discovery on its own, and nc.request would keep only the first (NATS.md 3)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    answers = []
    try:
        # A subject (or reply inbox) the user may not use fails at once, not after `first`.
        with watch(nc, subject):
            await nc.publish(subject, b"", reply=inbox)
            msg = await sub.next_msg(timeout=first)
        while True:
            if not msg.data:  # the server's no-responders status (503): nobody is there
                return answers
            answers.append(json.loads(msg.data))
            msg = await sub.next_msg(timeout=idle)
    except asyncio.TimeoutError:
        return answers
    finally:
        await sub.unsubscribe()


async def show_stats(nc, prefix: str | None, as_json: bool) -> int:
    answers = await collect_answers(nc, f"$SRV.STATS.{SERVICE_NAME}")
    if as_json:
        print(json.dumps(answers))
        return 0
    rows = stats_rows(answers, prefix)
    if not rows:
        print(f"poolwire: no worker answered $SRV.STATS.{SERVICE_NAME}"
              + (f" for prefix {prefix}" if prefix else ""), file=sys.stderr)
        return 1
    print(format_table(STATS_COLUMNS, rows))
    intakes = intake_rows(answers, prefix)
    if intakes:  # workers with --durable or a pipeline
        print()
        print(format_table(INTAKE_COLUMNS, intakes))
    return 0


async def tail_events(nc, prefix: str, replay: str | None, since: datetime | None,
                      count: int, idle_timeout: float | None) -> int:
    """Print deprecation events as JSON lines: stored ones first when asked (`replay` "all", or
    `since`), then new ones. Stops after `count` events, or `idle_timeout` seconds without one."""
    subject = f"{prefix}.events.deprecation"
    if replay or since:
        from nats.js.api import ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        js = nc.jetstream()
        try:
            with watch(nc, "$JS.API.STREAM.NAMES"):
                await js.find_stream_name_by_subject(subject)
        except NotFoundError:
            print(f"poolwire: no stream keeps {subject}; showing new events only", file=sys.stderr)
            sub = await nc.subscribe(subject)
        else:
            # An ordered consumer: ephemeral, in stream order, and restarted by nats-py itself
            # after a gap, so a replay neither skips nor repeats events.
            if since is None:
                config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
            else:
                start = since.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
                config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                                        opt_start_time=start)
            sub = await js.subscribe(subject, ordered_consumer=True, config=config)
    else:
        sub = await nc.subscribe(subject)
    seen = 0
    try:
        # A subscription the user may not make fails at once, not after the idle timeout.
        with watch(nc, subject, subscription=True):
            while not count or seen < count:
                try:
                    msg = await sub.next_msg(timeout=idle_timeout)
                except asyncio.TimeoutError:
                    return 0
                print(json.dumps(msgpack.unpackb(msg.data, raw=False)), flush=True)
                seen += 1
    finally:
        await sub.unsubscribe()
    return 0


# ---- `poolwire lag`: what KEDA's nats-jetstream scaler sees ----

# KEDA's scaler (kedacore/keda pkg/scalers/nats_jetstream_scaler.go) asks a server's monitoring
# port for this, finds account -> stream -> consumer by name, and scales on
# num_pending + num_ack_pending; a stream without that consumer counts as its last sequence.
JSZ_QUERY = "/jsz?acc={account}&consumers=true&config=true"
DEFAULT_ACCOUNT = "$G"  # the account of users declared outside `accounts` (deploy/nats/)


def jsz_url(monitoring_url: str, account: str) -> str:
    base = monitoring_url.rstrip("/")
    if "://" not in base:  # KEDA's natsServerMonitoringEndpoint is host:port, without a scheme
        base = "http://" + base
    return base + JSZ_QUERY.format(account=account)


class LagError(ValueError):
    """The stream (or account) is not where the scaler would look; the message says what is."""


def keda_lag(jsz: dict, account: str, stream: str, consumer: str) -> dict:
    """The lag KEDA computes from a /jsz answer, with the figures it is made of. `consumer_found`
    is False when the stream has no such consumer: KEDA then scales on the stream's last
    sequence, which never falls, so workers are never scaled to zero."""
    accounts = jsz.get("account_details") or []
    acc = next((a for a in accounts if a.get("name") == account), None)
    if acc is None:
        raise LagError(f"account {account!r} is not in the server's /jsz answer (accounts: "
                       f"{', '.join(a.get('name', '?') for a in accounts) or 'none'}); pass "
                       f"--account with the account the workers' users belong to")
    streams = acc.get("stream_detail") or []
    found = next((s for s in streams if s.get("name") == stream), None)
    if found is None:
        raise LagError(f"stream {stream!r} not found in account {account!r} (streams: "
                       f"{', '.join(s.get('name', '?') for s in streams) or 'none'}); start a "
                       f"durable worker once (it creates the stream) or check --prefix/--stream; "
                       f"with a JetStream cluster, ask the stream's leader's monitoring port")
    for c in found.get("consumer_detail") or []:
        if c.get("name") == consumer:
            pending, ack_pending = int(c.get("num_pending", 0)), int(c.get("num_ack_pending", 0))
            return {"stream": stream, "consumer": consumer, "consumer_found": True,
                    "num_pending": pending, "num_ack_pending": ack_pending,
                    "lag": pending + ack_pending}
    last_seq = int((found.get("state") or {}).get("last_seq", 0))
    return {"stream": stream, "consumer": consumer, "consumer_found": False,
            "num_pending": None, "num_ack_pending": None, "lag": last_seq}


def lag_line(reading: dict) -> str:
    if not reading["consumer_found"]:
        return (f"{reading['lag']}  (stream {reading['stream']} has no consumer "
                f"{reading['consumer']}: KEDA would scale on the stream's last sequence; check "
                f"--queue, or start one durable worker to create the consumer)")
    return (f"{reading['lag']}  (num_pending {reading['num_pending']} + num_ack_pending "
            f"{reading['num_ack_pending']}; stream {reading['stream']}, consumer "
            f"{reading['consumer']})")


def read_jsz(url: str, timeout: float = 5.0) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (operator's URL)
        return json.loads(answer.read())


async def jetstream_lag(nc, stream: str, consumer: str) -> dict:
    """The same figures through the JetStream API, for an operator without the monitoring port
    (the workers' user may not call $JS.API.CONSUMER.INFO: use an operator's credentials)."""
    from nats.js.errors import NotFoundError

    try:
        info = await nc.jetstream().consumer_info(stream, consumer)
    except NotFoundError:
        raise LagError(f"no consumer {consumer!r} on stream {stream!r}: start a durable worker "
                       f"once (it creates both) or check --prefix/--queue/--stream") from None
    return {"stream": stream, "consumer": consumer, "consumer_found": True,
            "num_pending": info.num_pending, "num_ack_pending": info.num_ack_pending,
            "lag": info.num_pending + info.num_ack_pending}
