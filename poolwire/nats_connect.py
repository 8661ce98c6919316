"""How poolwire connects to NATS: one place that turns the connection settings (URL or cluster
URLs, credentials file, NKey seed, user and password, token, TLS) into a nats-py connection,
shared by the worker, the Python client and the CLI.

- The first connection fails within `connect_timeout_s` with one line saying why
  (`NatsConnectError`); nats-py alone retries forever when reconnects are unlimited.
- Reconnects after a loss are unlimited, each after a short wait with jitter, so a restarted
  server is rejoined within about `reconnect_wait_s` and a fleet of workers does not reconnect
  in lockstep.
- Secrets are pydantic SecretStr and URLs are shown with their userinfo redacted, so nothing
  printed or logged carries a credential.
"""

import asyncio
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from poolwire.nats_client import ResilientClient
from poolwire.refusals import Refusals

log = logging.getLogger(__name__)

SCHEMES = ("nats", "tls", "ws", "wss")
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_RECONNECT_WAIT_S = 0.25

# The option and environment names of each setting, for messages that tell what to change.
OPTION_NAMES = {
    "servers": "--nats-url / NATS_URL", "creds": "--nats-creds / NATS_CREDS",
    "nkey": "--nats-nkey / NATS_NKEY", "user": "--nats-user / NATS_USER",
    "password": "--nats-password / NATS_PASSWORD", "token": "--nats-token / NATS_TOKEN",
    "ca": "--nats-ca / NATS_CA", "cert": "--nats-cert / NATS_CERT", "key": "--nats-key / NATS_KEY",
}


class NatsConnectError(Exception):
    """The first connection failed; str() is one line naming the server, the cause and a fix."""


def parse_servers(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` (every URL of a cluster) or a single URL; a bare
    `host:port` means nats://host:port."""
    servers = []
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        if "://" not in part:
            part = "nats://" + part
        scheme = part.split("://", 1)[0].lower()
        if scheme not in SCHEMES:
            raise ValueError(f"NATS URL {redact_url(part)!r} has scheme {scheme!r}; use one of "
                             f"{', '.join(s + '://' for s in SCHEMES)}")
        servers.append(part)
    if not servers:
        raise ValueError(f"NATS URL {url!r} names no server; give nats://host:4222 "
                         "(several, comma-separated, for a cluster)")
    return servers


def redact_url(url: str) -> str:
    """The URL with any user, password or token replaced by `***`, fit to print or log."""
    out = []
    for part in url.split(","):
        try:
            p = urlsplit(part.strip())
        except ValueError:
            out.append("***")
            continue
        if "@" in p.netloc:
            p = p._replace(netloc="***@" + p.netloc.rsplit("@", 1)[1])
        out.append(urlunsplit(p))
    return ",".join(out)


def reconnect_delay(wait_s: float, rng: random.Random | None = None) -> float:
    """Seconds before the next reconnect attempt: uniform in [wait/2, wait]. The jitter keeps
    many workers from hitting a restarted server in the same instant; the bound keeps a
    restart short for every one of them."""
    return (rng or random).uniform(wait_s / 2, wait_s)


def pick_server(servers: list, rng: random.Random | None = None):
    """The next server to try: one of those tried least often, so every cluster URL is tried
    in turn before any is tried again."""
    fewest = min(s.reconnects for s in servers)
    return (rng or random).choice([s for s in servers if s.reconnects == fewest])


@dataclass(frozen=True)
class NatsOptions:
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    creds: Path | None = None         # credentials file: user JWT and NKey seed
    nkey: Path | None = None          # NKey seed file
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    ca: Path | None = None            # CA bundle that signed the server's certificate
    cert: Path | None = None          # client certificate (mutual TLS), with `key`
    key: Path | None = None
    inbox_prefix: str | None = None   # per-user reply subjects, for permissions that isolate them
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    reconnect_wait_s: float = DEFAULT_RECONNECT_WAIT_S

    @classmethod
    def from_values(cls, url: str | None, **values: Any) -> "NatsOptions":
        """From settings-like values (None: not given); plain strings become SecretStr/Path."""
        known = {f.name for f in fields(cls)} - {"servers"}
        if unknown := set(values) - known:
            raise TypeError(f"unknown NATS connection option(s) {sorted(unknown)}; "
                            f"known: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = values.get(f.name)
            if value is None or f.name == "servers":
                continue
            if f.name in ("password", "token") and not isinstance(value, SecretStr):
                value = SecretStr(str(value))
            if f.name in ("creds", "nkey", "ca", "cert", "key"):
                value = Path(value)
            kwargs[f.name] = value
        if url:
            kwargs["servers"] = tuple(parse_servers(url))
        return cls(**kwargs)

    @property
    def display_url(self) -> str:
        return redact_url(",".join(self.servers))

    def check(self) -> None:
        """Refuse missing files and half-given pairs before any connection attempt."""
        for name in ("creds", "nkey", "ca", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise NatsConnectError(f"NATS {name} file {str(path)!r} does not exist or is not a "
                                       f"file; fix {OPTION_NAMES[name]}")
        if (self.cert is None) != (self.key is None):
            raise NatsConnectError("a TLS client certificate needs both --nats-cert and --nats-key "
                                   "(NATS_CERT and NATS_KEY); only one was given")
        if self.creds is not None and self.nkey is not None:
            raise NatsConnectError("give either a credentials file (--nats-creds / NATS_CREDS) or "
                                   "an NKey seed (--nats-nkey / NATS_NKEY), not both")
        if self.password is not None and self.user is None:
            raise NatsConnectError("a NATS password needs a user: set --nats-user / NATS_USER")

    def tls_context(self) -> ssl.SSLContext | None:
        if self.ca is None and self.cert is None:
            return None
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
            if self.cert is not None:
                ctx.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as exc:
            raise NatsConnectError(f"could not load the TLS files (CA {self.ca}, certificate "
                                   f"{self.cert}, key {self.key}): {exc}; check "
                                   f"{OPTION_NAMES['ca']}, {OPTION_NAMES['cert']}, "
                                   f"{OPTION_NAMES['key']}") from None
        return ctx

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for nats-py's `Client.connect`, without callbacks."""
        kw: dict[str, Any] = {
            "servers": list(self.servers), "connect_timeout": self.connect_timeout_s,
            # nats-py waits this long between tries of one server during the first connect;
            # later reconnects go through reconnect_to_server_handler below, with jitter.
            "reconnect_time_wait": self.reconnect_wait_s, "max_reconnect_attempts": -1,
        }
        if self.creds is not None:
            kw["user_credentials"] = str(self.creds)
        if self.nkey is not None:
            kw["nkeys_seed"] = str(self.nkey)
        if self.user is not None:
            kw["user"] = self.user
        if self.password is not None:
            kw["password"] = self.password.get_secret_value()
        if self.token is not None:
            kw["token"] = self.token.get_secret_value()
        if (ctx := self.tls_context()) is not None:
            kw["tls"] = ctx
        if self.inbox_prefix:
            kw["inbox_prefix"] = self.inbox_prefix
        return kw


def _hint(exc: BaseException | None) -> str:
    text = str(exc or "").lower()
    if "authorization" in text or "authentication" in text or "user" in text and "jwt" in text:
        return ("the server refused the credentials; check " + ", ".join(
            OPTION_NAMES[k] for k in ("creds", "nkey", "user", "password", "token")))
    if isinstance(exc, ssl.SSLError) or "ssl" in text or "tls" in text or "certificate" in text:
        return (f"TLS failed; check {OPTION_NAMES['ca']} (the CA that signed the server's "
                f"certificate), {OPTION_NAMES['cert']} and {OPTION_NAMES['key']}")
    if isinstance(exc, ConnectionResetError):
        # A server that refuses credentials writes -ERR and closes at once; the reset can
        # overtake the -ERR line, so a reset during the handshake most often means that.
        return ("the server closed the connection during the handshake: check the credentials ("
                + ", ".join(OPTION_NAMES[k] for k in ("creds", "nkey", "user", "token"))
                + f") and whether it requires TLS ({OPTION_NAMES['ca']})")
    return f"check {OPTION_NAMES['servers']} and that nats-server is running and reachable"


def _fatal_at_start(exc: BaseException) -> bool:
    """Errors that another try within the connect timeout cannot fix."""
    text = str(exc).lower()
    return ("authorization violation" in text or "authentication" in text
            or isinstance(exc, ssl.SSLCertVerificationError))


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no answer"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


Callback = Callable[[], Awaitable[None]]


async def connect(opts: NatsOptions, *, name: str | None = None,
                  closed_cb: Callback | None = None, disconnected_cb: Callback | None = None,
                  reconnected_cb: Callback | None = None,
                  refused_cb: Callable[[str], None] | None = None) -> ResilientClient:
    """Connect within `opts.connect_timeout_s` or raise NatsConnectError (one line).

    Later, nats-py reconnects forever; a server that refuses the credentials on a reconnect
    (they were revoked) would keep it trying forever, so `refused_cb` gets that as one line."""
    opts.check()
    kwargs = opts.connect_kwargs()
    nc = ResilientClient()
    # Subjects the server refuses this user by permission: requests waiting on them fail at
    # once (poolwire.refusals) instead of waiting out their timeout.
    nc.refusals = Refusals(opts.inbox_prefix or "_INBOX")
    last_error: list[BaseException] = []
    fatal = asyncio.Event()
    connected = False
    outage_errors: set[str] = set()

    async def error_cb(exc: Exception) -> None:
        if not connected:
            if not fatal.is_set():  # the refusal is the cause, whatever the retries report next
                last_error[:] = [exc]
            if _fatal_at_start(exc):
                fatal.set()
            return
        if nc.refusals.notify(str(exc)):
            return  # the request it concerns raises it, in one line
        # During an outage nats-py reports every failed try (several a second); log each
        # distinct error once per outage.
        key = _describe(exc)
        if refused_cb is not None and _fatal_at_start(exc):
            refused_cb(f"the NATS server refused the credentials on reconnecting ({key}); "
                       f"{_hint(exc).removeprefix('the server refused the credentials; ')}")
        if key not in outage_errors:
            outage_errors.add(key)
            log.warning("NATS connection: %s", key)

    async def on_reconnected() -> None:
        outage_errors.clear()
        log.info("reconnected to NATS at %s", redact_url(str(nc.connected_url.geturl()))
                 if nc.connected_url else opts.display_url)
        if reconnected_cb is not None:
            await reconnected_cb()

    def next_server(servers, _info):
        return pick_server(servers), reconnect_delay(opts.reconnect_wait_s)

    attempt = asyncio.ensure_future(nc.connect(
        **kwargs, name=name, error_cb=error_cb, closed_cb=closed_cb,
        disconnected_cb=disconnected_cb, reconnected_cb=on_reconnected,
        reconnect_to_server_handler=next_server))
    gave_up = asyncio.ensure_future(fatal.wait())
    try:
        await asyncio.wait({attempt, gave_up}, timeout=opts.connect_timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        attempt.cancel()
        await close_quietly(nc)
        raise
    finally:
        gave_up.cancel()
    if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
        connected = True
        return nc
    if attempt.done() and not attempt.cancelled() and not fatal.is_set():
        last_error[:] = [attempt.exception()]
    attempt.cancel()
    await asyncio.gather(attempt, return_exceptions=True)
    await close_quietly(nc)
    cause = last_error[0] if last_error else None
    within = "" if fatal.is_set() else f" within {opts.connect_timeout_s:g} s"
    raise NatsConnectError(f"could not connect to NATS at {opts.display_url}{within} "
                           f"({_describe(cause)}); {_hint(cause)}")


async def close_quietly(nc) -> None:
    """Close a client whose server may be gone: nats-py can raise ConnectionResetError there
    (NATS.md section 9), and nothing is left to save."""
    try:
        if not nc.is_closed:
            await asyncio.wait_for(nc.close(), 2.0)
    except Exception as exc:
        log.debug("closing the NATS connection: %r", exc)



def nats_options(settings: Any, url: str | None = None) -> NatsOptions:
    """From WorkerSettings (or anything with its nats_* attributes); `url` overrides
    settings.nats_url (the embedded server's URL, a test server's)."""
    names = ("creds", "nkey", "user", "password", "token", "ca", "cert", "key", "inbox_prefix",
             "connect_timeout_s", "reconnect_wait_s")
    values = {n: getattr(settings, "nats_" + n, None) for n in names}
    return NatsOptions.from_values(url or getattr(settings, "nats_url", None), **values)
