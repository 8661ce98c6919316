"""Two regions on loopback: one nats-server per cluster, joined by gateways (a NATS
supercluster), each with JetStream. For tests/test_gateways_e2e.py."""

import contextlib
import socket
from pathlib import Path

from poolwire.actors.nats_server import NatsServer


def free_port() -> int:
    """A port the OS calls free now: gateways need each other's listen port before either
    starts, so the port cannot come from -p -1 as the client port does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_conf(region: str, store: Path, gateways: dict[str, int], route_port: int) -> str:
    """JetStream across gateways wants a cluster block with routes even for a one-server
    cluster ("JetStream cluster requires configured routes"): the server's own route does."""
    urls = ", ".join(f'{{ name: "{name}", url: "nats://127.0.0.1:{port}" }}'
                     for name, port in gateways.items())
    return (f'server_name: "{region}-1"\n'
            f'jetstream {{ store_dir: "{store}" }}\n'
            f'cluster {{ name: "{region}", listen: "127.0.0.1:{route_port}", '
            f'routes: ["nats-route://127.0.0.1:{route_port}"] }}\n'
            f'gateway {{\n  name: "{region}"\n  listen: "127.0.0.1:{gateways[region]}"\n'
            f'  gateways: [ {urls} ]\n}}\n')


@contextlib.contextmanager
def supercluster(root: Path, regions=("A", "B")):
    """{region: NatsServer}, each a one-server cluster named after its region, with a
    monitoring port (/gatewayz, /jsz). Stopped (by PID) on exit."""
    ports = {region: free_port() for region in regions}
    servers: dict[str, NatsServer] = {}
    try:
        for region in regions:
            home = root / region
            home.mkdir(parents=True)
            conf = home / "server.conf"
            conf.write_text(gateway_conf(region, home / "js", ports, free_port()))
            # jetstream=False: the config carries the JetStream block with its store.
            servers[region] = NatsServer(store_dir=home, config=conf, jetstream=False,
                                         monitoring=True)
            servers[region].start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
