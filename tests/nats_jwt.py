"""NATS JWTs (decentralised auth, JWT v2) for tests: an operator, accounts and users, signed
with ed25519 NKeys, and `.creds` files in the layout `nsc` writes.

Written here because no maintained Python library issues NATS JWTs: nats-py and the `nkeys`
package only *use* a user JWT (they sign the server's nonce), and the issuing side lives in Go
(nats-io/jwt, behind `nsc`), which this machine does not have. The format follows nats-io/jwt v2
(claims.go, header.go, operator_claims.go, account_claims.go, user_claims.go, types.go):

    base64url(header) "." base64url(claims) "." base64url(ed25519 signature of the first two)

with no padding, header {"typ": "JWT", "alg": "ed25519-nkey"}, and claims `jti` (an id: the
base32 SHA-512/256 of the claims), `iat`, `iss` (the signer's public key), `sub` (the subject's
public key), `name`, optional `exp`, and a `nats` object with `type` and `version: 2`."""

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

UNLIMITED = -1


@dataclass(frozen=True)
class Key:
    """An NKey pair: `seed` (secret, starts with S) and `public` (starts with O, A or U)."""

    seed: bytes
    public: str

    @classmethod
    def new(cls, prefix: int) -> "Key":
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        return cls(seed, nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return nkeys.from_seed(bytearray(self.seed)).sign(data)


def operator_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_OPERATOR)


def account_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_ACCOUNT)


def user_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_USER)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode(issuer: Key, subject: str, name: str, nats: dict[str, Any],
           expires: int | None = None) -> str:
    """A signed JWT of `nats["type"]` about `subject`, issued by `issuer`."""
    claims: dict[str, Any] = {"iat": int(time.time()), "iss": issuer.public, "name": name,
                              "sub": subject}
    if expires is not None:
        claims["exp"] = expires
    # nats-io/jwt hashes the generic claims without the id; the server does not check it.
    digest = hashlib.new("sha512_256", json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    claims["nats"] = {**nats, "version": 2}
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(claims).encode())
    signed = f"{header}.{payload}".encode()
    return f"{header}.{payload}.{_b64(issuer.sign(signed))}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (for assertions about what a test made)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def operator_jwt(operator: Key, system_account: str, name: str = "test-operator") -> str:
    return encode(operator, operator.public, name,
                  {"type": "operator", "system_account": system_account})


def account_limits(jetstream: bool) -> dict[str, Any]:
    """Every limit given explicitly: in an account JWT an absent limit reads as 0, and 0 means
    none allowed (no connections, no subscriptions), not unlimited. JetStream is on for an
    account only when a storage limit is not 0."""
    limits: dict[str, Any] = {"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
                              "imports": UNLIMITED, "exports": UNLIMITED, "wildcards": True,
                              "conn": UNLIMITED, "leaf": UNLIMITED}
    if jetstream:
        limits |= {"mem_storage": UNLIMITED, "disk_storage": UNLIMITED,
                   "streams": UNLIMITED, "consumer": UNLIMITED}
    return limits


def account_jwt(operator: Key, account: Key, name: str, jetstream: bool = False) -> str:
    return encode(operator, account.public, name,
                  {"type": "account", "limits": account_limits(jetstream)})


def user_jwt(account: Key, user: Key, name: str, pub: list[str] | None = None,
             sub: list[str] | None = None, allow_responses: bool = False,
             expires: int | None = None) -> str:
    """A user of `account`; `pub`/`sub`: the subjects it may publish/subscribe to (None: all).
    `allow_responses`: it may publish one reply to each request it received (a service)."""
    nats: dict[str, Any] = {"type": "user", "subs": UNLIMITED, "data": UNLIMITED,
                            "payload": UNLIMITED}
    if pub is not None:
        nats["pub"] = {"allow": pub}
    if sub is not None:
        nats["sub"] = {"allow": sub}
    if allow_responses:
        nats["resp"] = {"max": 1_000_000, "ttl": 0}
    return encode(account, user.public, name, nats, expires)


def write_creds(path: Path, jwt: str, user: Key) -> Path:
    """A credentials file as `nsc generate creds` writes it (nats-io/jwt creds_utils.go),
    readable by its owner only."""
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed.decode()}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n")
    path.chmod(0o600)
    return path


def server_config(operator_token: str, system_account: str, accounts: dict[str, str]) -> str:
    """A nats-server config for operator mode with every account JWT preloaded in memory."""
    preload = "\n".join(f"  {public}: {token}" for public, token in accounts.items())
    return (f"operator: {operator_token}\n"
            f"system_account: {system_account}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}\n}}\n")
