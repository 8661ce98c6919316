"""Make the NKey users of deploy/nats/nats-server.conf: writes the seeds (secrets) to
<dir>/worker.nk and <dir>/publisher.nk, and prints the public keys (not secret) as the
variables the server config reads, for compose's .env file:

    python deploy/nats/make_nkeys.py secrets >> .env

The seeds are readable by their owner only; the worker image runs as uid 10001, so give it
the worker's seed (chown 10001 secrets/worker.nk) or mount it with your orchestrator's
secret permissions. Uses the `nkeys` package, which poolwire installs with nats-py[nkeys]."""

import os
import sys
from pathlib import Path

import nkeys


def make_user(path: Path) -> str:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite a key
    with os.fdopen(fd, "wb") as f:
        f.write(seed + b"\n")
    return nkeys.from_seed(bytearray(seed)).public_key.decode()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python deploy/nats/make_nkeys.py SECRETS_DIR  (then >> .env)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for role in ("worker", "publisher"):
        try:
            public = make_user(out / f"{role}.nk")
        except FileExistsError:
            print(f"{out / (role + '.nk')} exists; remove it to make a new key", file=sys.stderr)
            return 1
        print(f"POOLWIRE_{role.upper()}_NKEY={public}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
