"""What the CLI's commands share about NATS: the connection options every client command takes
(the same names and variables as `poolwire serve`'s), and the exit codes of all commands."""

import argparse
import os

# Exit codes of `poolwire serve` (and, where they apply, of the client commands).
EXIT_CONFIG = 2             # a bad option, model folder or task
EXIT_NATS_UNAVAILABLE = 3   # NATS unreachable within the connect timeout, or credentials refused
EXIT_DEAF = 4               # the worker stopped receiving and could not recover: replace it
EXIT_NO_RESPONDERS = 4      # client commands: no worker serves the subject
EXIT_TIMEOUT = 5            # client commands: no reply within --timeout


SERVE_EXIT_CODES = f"""exit codes:
  0  stopped by Ctrl-C or SIGTERM after draining (also while NATS was down)
  {EXIT_CONFIG}  a bad option, model folder or task (one line on stderr)
  {EXIT_NATS_UNAVAILABLE}  NATS not reachable within --nats-connect-timeout-s, or credentials/TLS refused
  {EXIT_DEAF}  the worker stopped receiving and reconnecting did not help: replace it"""

CLIENT_EXIT_CODES = """exit codes:
  0  the reply was printed
  1  the worker answered with an error (printed as JSON on stderr)
  3  NATS could not be reached, refused the credentials, or refused them this subject
     (one line on stderr)
  4  no worker serves this subject (no responders)
  5  no reply within --timeout"""

CLIENT_CONNECTION_OPTIONS = (
    # (option, environment variable, help)
    ("--nats-url", "NATS_URL", "NATS server, or every URL of a cluster comma-separated"),
    ("--nats-creds", "NATS_CREDS", "credentials file (user JWT and NKey seed)"),
    ("--nats-nkey", "NATS_NKEY", "NKey seed file"),
    ("--nats-user", "NATS_USER", "user"),
    ("--nats-password", "NATS_PASSWORD", "password (prefer the variable: options show in ps)"),
    ("--nats-token", "NATS_TOKEN", "token"),
    ("--nats-ca", "NATS_CA", "CA certificate that signed the server's"),
    ("--nats-cert", "NATS_CERT", "TLS client certificate"),
    ("--nats-key", "NATS_KEY", "TLS client key"),
    ("--nats-inbox-prefix", "POOLWIRE_NATS_INBOX_PREFIX",
     "prefix of this client's reply subjects (default _INBOX)"),
)


def add_connection_options(p: argparse.ArgumentParser) -> None:
    for option, env, text in CLIENT_CONNECTION_OPTIONS:
        default = os.environ.get(env) or ("nats://127.0.0.1:4222" if env == "NATS_URL" else None)
        p.add_argument(option, default=default, help=f"{text} (also {env})")
    p.add_argument("--connect-timeout", type=float, default=5.0,
                   help="give up (exit 3) when NATS does not accept the connection in this many s")


def connect_options(args) -> dict:
    names = ("creds", "nkey", "user", "password", "token", "ca", "cert", "key", "inbox_prefix")
    return {n: getattr(args, "nats_" + n) for n in names} | {
        "connect_timeout_s": args.connect_timeout}
