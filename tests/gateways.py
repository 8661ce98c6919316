"""Two regions on loopback: one nats-server per cluster, joined by gateways (a NATS
supercluster), each with JetStream. For tests/test_gateways_e2e.py."""

import contextlib
from pathlib import Path

from poolwire.actors.nats_server import NatsServer
from tests import procs


# Attempts at starting the regions: their gateway and route ports are picked before any server
# starts (each names the others'), so another process on this machine can take one in between
# (a client's outgoing connection gets its port from the same range): the regions then start
# again on other ports.
START_ATTEMPTS = 3


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
    servers = _start_regions(root, regions)
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _start_regions(root: Path, regions) -> dict[str, NatsServer]:
    attempt = 1
    while True:
        try:
            return _try_regions(root / f"attempt-{attempt}", regions)
        except RuntimeError as exc:
            if "address already in use" not in str(exc) or attempt == START_ATTEMPTS:
                raise
            attempt += 1


def _try_regions(root: Path, regions) -> dict[str, NatsServer]:
    """Every region started on newly picked ports, or none (the started ones stopped)."""
    picked = procs.free_ports(2 * len(regions))
    gateways = dict(zip(regions, picked))
    servers: dict[str, NatsServer] = {}
    try:
        for region, route_port in zip(regions, picked[len(regions):]):
            home = root / region
            home.mkdir(parents=True)
            conf = home / "server.conf"
            conf.write_text(gateway_conf(region, home / "js", gateways, route_port))
            # jetstream=False: the config carries the JetStream block with its store.
            servers[region] = NatsServer(store_dir=home, config=conf, jetstream=False,
                                         monitoring=True)
            servers[region].start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers
