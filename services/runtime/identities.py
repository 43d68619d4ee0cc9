"""Who may connect to a corral's NATS and what each identity may say, hear and ask.

With authentication on, the embedded nats-server knows these users, each with a password from the
cluster's credentials file (``credentials.json`` in the data directory, readable by its owner
only, a JSON object of user name to password). The server, not corral's code, enforces:

- ``services``: every decision service and the health monitor: anything, but create, change,
  purge or delete a stream (the log or the leases' bucket): those are the administrator's.
- ``agent-<node>``, one per node: its agent reads its own node's view and no other (its key in
  the ``corral_assignments`` bucket: a direct get whose subject names the key, and the key's
  subject to hear it change), sends its reports to the intake on ``corral.nreq.<node>`` (never
  into the stream: the intake appends them at ``corral.ev.node.<node>``, at the node's rate),
  heartbeats on ``corral.hb.<node>``, ships its workers' output on ``corral.out.<node>.>`` (and
  reads back the newest of it, to resume), nothing else; so an agent (or whoever took its node)
  cannot read or write the log, read other nodes' assignments, report for another node or write
  decisions.
- ``intake``: takes clients' requests on ``corral.req.>`` and node agents' reports on
  ``corral.nreq.>``, and appends them to the log at ``corral.in.<tenant>.<verb>`` and
  ``corral.ev.node.<node>``; it may publish there, into askers' and agents' inboxes (its
  answers) and ask the stream's info, nothing else. Its JetStream acknowledgements come to its
  own inbox.
- ``query``: the read service. It may read the stream (stream info, its own consumers and their
  flow control), the start forecasts' bucket and the workers' output (direct gets; it hears
  ``corral.out.>`` to follow a job's output), take questions on
  ``corral.read.>``, and publish only into the askers' inboxes:
  so however a question names its reply subject, its answer can never land in the log.
- ``admin``: send ``corral.req.admin.>`` (queues, cohorts, priority classes, cordons), ask
  ``corral.read.admin.>`` (the read service shows the admin everything), and create and
  configure the log's stream and the leases' bucket (``corral up`` does it as ``admin``).
- one user per tenant T: send ``corral.req.T.>`` (submit, cancel, resize), ask
  ``corral.read.T.>``. Nothing of ``$JS.API``, nothing of the stream's subjects, nothing of
  ``corral.out`` (its jobs' output comes through the read service, which checks whose job it
  is): a tenant can
  neither write the log (JetStream would acknowledge to any reply subject it chose, into the
  log, a lease, another's inbox) nor read it, only ask the intake and the read service.

Replies to an identity go to its own inbox prefix, ``_INBOX.corral.<name>``, the only subjects
it may subscribe to: an identity allowed ``_INBOX.>`` could hear every other identity's answers.
Identity names are NATS subject tokens; ``services``, ``query`` and ``admin`` are no tenant's.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

from corral.events import subjects
from corral.events.server import Permissions, User, write_private
from corral.services.runtime import forecasts, output, views

SERVICES = "services"
QUERY = "query"
INTAKE = "intake"
ADMIN = subjects.ADMIN
RESERVED = frozenset({SERVICES, QUERY, INTAKE, ADMIN})
CREDENTIALS = "credentials.json"

READ = "corral.read"  # corral.read.<asker>.<question>: questions to the read service
INBOXES = "_INBOX.corral"  # _INBOX.corral.<name>.<...>: where each identity hears its replies
QUERY_INBOX = "_INBOX.query"  # the read service's own replies (JetStream API, deliveries)
INTAKE_INBOX = "_INBOX.intake"  # the intake's own replies (JetStream acknowledgements)
AGENT_PREFIX = subjects.AGENT_PREFIX  # agent-<node>: a node agent's identity
AGENT_INBOXES = subjects.AGENT_INBOXES  # _INBOX.agent.<node>.<...>: where each agent hears its replies


class CredentialsError(Exception):
    """A credentials file that cannot be read, or a name that cannot be an identity."""


def read_subject(asker: str, question: str) -> str:
    return f"{READ}.{asker}.{question}"


def parse_read(subject: str) -> tuple[str, str] | None:
    """``corral.read.<asker>.<question>`` → (asker, question); None for anything else."""
    parts = subject.split(".")
    if len(parts) != 4 or f"{parts[0]}.{parts[1]}" != READ:
        return None
    return parts[2], parts[3]


def inbox_prefix(name: str) -> str:
    """Where ``name`` hears replies: give it to the client as its inbox prefix."""
    return f"{INBOXES}.{name}"


def check_tenant(name: str) -> str:
    if not subjects.is_token(name):
        raise CredentialsError(f"tenant {name!r}: use letters, digits, '-' and '_' (at most 64)")
    if name in RESERVED:
        raise CredentialsError(f"tenant {name!r}: that name is taken by corral's own {name} identity")
    if name.startswith(AGENT_PREFIX):
        raise CredentialsError(f"tenant {name!r}: names starting {AGENT_PREFIX!r} are node agents'")
    return name


def agent(node: str) -> str:
    """The identity of ``node``'s agent."""
    return f"{AGENT_PREFIX}{node}"


def agent_inbox(node: str) -> str:
    """Where ``node``'s agent hears its replies: give it to its connection as the inbox prefix."""
    return f"{AGENT_INBOXES}.{node}"


def _node_of(name: str) -> str | None:
    node = name[len(AGENT_PREFIX) :] if name.startswith(AGENT_PREFIX) else None
    return node if node is not None and subjects.is_token(node) else None


def _js_read(stream: str) -> tuple[str, ...]:
    """What reading ``stream`` through an ordered push consumer needs to publish."""
    api = "$JS.API"
    return (
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"$JS.FC.{stream}.>",  # flow control and stall answers
    )


# The streams corral keeps: the log, the leases' key-value bucket, the node views' bucket, the
# start forecasts' bucket and the workers' output.
STREAMS = (subjects.STREAM, "KV_corral_leases", views.STREAM, forecasts.STREAM, output.STREAM)


def _stream_admin() -> tuple[str, ...]:
    """What creating and configuring corral's streams needs to publish."""
    api = "$JS.API.STREAM"
    return tuple(f"{api}.{verb}.{s}" for s in STREAMS for verb in ("CREATE", "UPDATE", "INFO"))


def permissions(name: str) -> Permissions | None:
    """What identity ``name`` may do (None: anything)."""
    if name == SERVICES:
        api = "$JS.API.STREAM"
        return Permissions(
            publish=(">",),
            subscribe=(">",),
            deny_publish=tuple(
                f"{api}.{verb}.>" for verb in ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE")
            ),
        )
    if name == QUERY:
        return Permissions(
            # and the forecast role's bucket, key by key (direct gets), to add starts to answers
            publish=(
                *_js_read(subjects.STREAM),
                f"{INBOXES}.>",
                f"$JS.API.DIRECT.GET.{forecasts.STREAM}.>",
                # workers' output, message by message, for the asker's own jobs (``output``)
                f"$JS.API.DIRECT.GET.{output.STREAM}",
            ),
            # the output's subjects, to hear that a followed job printed more
            subscribe=(f"{QUERY_INBOX}.>", f"{READ}.>", f"{output.OUT}.>"),
        )
    node = _node_of(name)
    if node is not None:
        return Permissions(
            publish=(
                subjects.node_intake(node),  # its reports, to the intake
                subjects.heartbeat(node),
                views.direct_get_subject(node),
                views.parts_subject(node),  # its view's parts, where it is too large for one message
                # its own workers' output, and where it had shipped it to (a restarted agent)
                f"{output.OUT}.{node}.>",
                f"$JS.API.DIRECT.GET.{output.STREAM}.{output.OUT}.{node}.>",
            ),
            subscribe=(f"{agent_inbox(node)}.>", views.key_subject(node)),
        )
    if name == INTAKE:
        return Permissions(
            publish=(
                f"{subjects.IN}.>",
                subjects.node("*"),
                f"{INBOXES}.>",
                f"{AGENT_INBOXES}.>",
                f"$JS.API.STREAM.INFO.{subjects.STREAM}",
            ),
            subscribe=(f"{INTAKE_INBOX}.>", f"{subjects.REQ}.>", f"{subjects.NREQ}.>"),
        )
    # The admin and every tenant: their own requests, their own questions, their own inbox.
    own = (f"{subjects.REQ}.{name}.>", f"{READ}.{name}.>")
    return Permissions(
        publish=(*own, *_stream_admin()) if name == ADMIN else own,
        subscribe=(f"{inbox_prefix(name)}.>",),
    )


def users(passwords: Mapping[str, str]) -> list[User]:
    """The server's users for a credentials file's passwords."""
    return [
        User(name, pw, permissions(name if name in RESERVED or _node_of(name) else check_tenant(name)))
        for name, pw in sorted(passwords.items())
    ]


def load(path: str | os.PathLike[str]) -> dict[str, str]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CredentialsError(f"cannot read credentials {path}: {e}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise CredentialsError(f"{path}: credentials are a JSON object of user name to password")
    return data


def ensure(path: str | os.PathLike[str], tenants: Iterable[str], nodes: Iterable[str] = ()) -> dict[str, str]:
    """The cluster's passwords: those already in ``path``, and a new one for each identity (the
    four of corral's own, each of ``tenants``, each agent of ``nodes``) that has none yet.
    Written back readable by its owner only. Existing passwords are kept, so clients keep
    working across restarts."""
    p = Path(path)
    passwords = load(p) if p.exists() else {}
    wanted = [SERVICES, QUERY, INTAKE, ADMIN, *(check_tenant(t) for t in tenants), *map(agent, nodes)]
    for name in wanted:
        if name not in passwords:
            passwords[name] = secrets.token_urlsafe(24)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_private(p, json.dumps(passwords, indent=2, sort_keys=True) + "\n")
    return passwords


def login(passwords: Mapping[str, str], name: str) -> dict[str, str]:
    """nats-py connect options for identity ``name``."""
    if name not in passwords:
        raise CredentialsError(f"no password for {name!r} in the credentials")
    return {"user": name, "password": passwords[name]}
