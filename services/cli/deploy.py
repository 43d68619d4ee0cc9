"""What a deployment of separate machines (compose.yaml) needs before and after NATS starts.

``corral deploy nats-config`` runs once, before any nats-server, in an init container: it makes
every identity's password (as ``corral up --auth`` does, ``services/runtime/identities.py``),
kept in the shared directory so that later runs keep them; a password for the routes between
the servers; each server's config (JetStream, the cluster's routes, the users with their
permissions); and one login file per identity (``logins/<name>.json``), so that each container
is handed its own login, not the operator's file of all. Nothing secret is written into
compose.yaml or the image.

``corral deploy setup`` runs once NATS answers, as the admin: it creates the log's stream and the
two buckets (leases and status; node views) with the replicas asked for, as ``corral up`` does on
one machine, and exits. The services only check that they exist.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.events import subjects
from corral.events.server import config_text, write_private
from corral.services.runtime import identities

ROUTES = "routes.json"  # the routes' own login: servers of one cluster only
CLIENT_PORT = 4222
CLUSTER_PORT = 6222
MONITOR_PORT = 8222


def _route_password(out: Path) -> str:
    path = out / ROUTES
    if path.exists():
        return str(json.loads(path.read_text())["password"])
    password = secrets.token_urlsafe(24)
    write_private(path, json.dumps({"user": "route", "password": password}) + "\n")
    return password


def server_config(name: str, servers: Sequence[str], users: str, route_password: str) -> str:
    """nats-server config of ``name``, one of ``servers`` (host names that resolve to each
    other): JetStream storing under /data, routes to the others, logins required."""
    routes = [f"nats://route:{route_password}@{s}:{CLUSTER_PORT}" for s in servers if s != name]
    cluster = {
        "name": "corral",
        "listen": f"0.0.0.0:{CLUSTER_PORT}",
        "authorization": {"user": "route", "password": route_password},
        "routes": routes,
    }
    lines = [
        f"server_name: {json.dumps(name)}",
        f'listen: "0.0.0.0:{CLIENT_PORT}"',
        f'http: "0.0.0.0:{MONITOR_PORT}"',
        'jetstream: {"store_dir": "/data"}',
    ]
    if len(servers) > 1:
        lines.append("cluster: " + json.dumps(cluster, indent=2))
    return "\n".join(lines) + "\n" + users


def nats_config(
    out: Path, servers: Sequence[str], nodes: Sequence[str], tenants: Sequence[str]
) -> list[Path]:
    """Write (or bring up to date, keeping every password made before) the passwords, each
    server's config and each identity's login file under ``out``. Returns the files written."""
    for s in servers:
        if not subjects.is_token(s):
            raise identities.CredentialsError(f"server name {s!r}: use letters, digits, '-' and '_'")
    out.mkdir(parents=True, exist_ok=True)
    passwords = identities.ensure(out / identities.CREDENTIALS, tenants, nodes)
    users = config_text(identities.users(passwords))
    route_password = _route_password(out)
    written = [out / identities.CREDENTIALS, out / ROUTES]
    for s in servers:
        path = out / f"{s}.conf"
        write_private(path, server_config(s, servers, users, route_password))
        written.append(path)
    logins = out / "logins"
    logins.mkdir(exist_ok=True)
    for name, password in sorted(passwords.items()):
        path = logins / f"{name}.json"
        write_private(path, json.dumps({name: password}) + "\n")
        written.append(path)
    return written


async def setup(url: str | list[str], replicas: int | None, login: dict[str, Any]) -> int:
    """Create the log's stream, the buckets and the output stream with ``replicas`` copies each
    (None: as the servers allow, three on a cluster of three or more), as the admin; return how
    many."""
    from corral.events.jetstream import JetStreamLog
    from corral.services.runtime import forecasts, lease, output, views

    log = await JetStreamLog.connect(url, create=True, replicas=replicas, name="corral-setup", **login)
    try:
        made = log.replicas or 1
        await lease.ensure_bucket(log.nc, replicas=made)
        await views.ensure_bucket(log.nc, replicas=made)
        await forecasts.ensure_bucket(log.nc, replicas=made)
        await output.ensure_stream(log.nc, replicas=made)
    finally:
        await log.close()
    return made
