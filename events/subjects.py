"""Subject names. Subjects name the entity an event is about, so a reader can subscribe narrowly
(one job, one node) and the stream can bound what any one subject stores."""

from __future__ import annotations

import re

STREAM = "CORRAL"
IN = "corral.in"
# Where clients send requests, request-reply on core NATS: the intake appends them to the log at
# ``corral.in.<tenant>.<verb>`` and answers. No client publishes into the stream itself, since
# JetStream sends its acknowledgement wherever the publisher's reply subject points.
REQ = "corral.req"
# Where node agents send their reports, request-reply on core NATS, for the same reason: the
# intake appends each at ``corral.ev.node.<node>``, the node taken from this subject.
NREQ = "corral.nreq"
# A node agent's identity is agent-<node> (no tenant's name starts so), and it hears the
# intake's answers on _INBOX.agent.<node>.<...>: the intake and the agents read both from here.
AGENT_PREFIX = "agent-"
AGENT_INBOXES = "_INBOX.agent"
EV = "corral.ev"
STREAM_SUBJECTS = (f"{IN}.>", f"{EV}.>")
ADMIN = "admin"

# One NATS subject token: no dots, wildcards or whitespace. Job, node, queue and tenant names
# must be one, since each becomes a token in a subject.
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def is_token(name: str) -> bool:
    # fullmatch, not ``^...$``: ``$`` also matches before a final newline, and a name ending in
    # one would pass here and then break every subject built from it.
    return _TOKEN.fullmatch(name) is not None


def request(tenant: str, verb: str) -> str:
    return f"{IN}.{tenant}.{verb}"


def intake(tenant: str, verb: str) -> str:
    """Where a client of ``tenant`` sends a ``verb`` request (the intake's subject)."""
    return f"{REQ}.{tenant}.{verb}"


def parse_intake(subject: str) -> tuple[str, str] | None:
    """``corral.req.<tenant>.<verb>`` → (tenant, verb); None for anything else."""
    return _tenant_and_verb(subject, "req")


def node_intake(node_id: str) -> str:
    """Where ``node_id``'s agent sends its reports (the intake's subject for nodes)."""
    return f"{NREQ}.{node_id}"


def parse_node_intake(subject: str) -> str | None:
    """``corral.nreq.<node>`` → the node; None for anything else."""
    parts = subject.split(".")
    if len(parts) != 3 or f"{parts[0]}.{parts[1]}" != NREQ or not is_token(parts[2]):
        return None
    return parts[2]


def admin(verb: str) -> str:
    return f"{IN}.{ADMIN}.{verb}"


def job(job_id: str) -> str:
    return f"{EV}.job.{job_id}"


def node(node_id: str) -> str:
    return f"{EV}.node.{node_id}"


def queue(name: str) -> str:
    return f"{EV}.queue.{name}"


def decision(role: str) -> str:
    return f"{EV}.decision.{role}"


def heartbeat(node_id: str) -> str:
    """Heartbeats travel on core NATS, not the log."""
    return f"corral.hb.{node_id}"


def parse_request(subject: str) -> tuple[str, str] | None:
    """``corral.in.<tenant>.<verb>`` → (tenant, verb); None for anything else."""
    return _tenant_and_verb(subject, "in")


def _tenant_and_verb(subject: str, kind: str) -> tuple[str, str] | None:
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != "corral" or parts[1] != kind or not is_token(parts[2]):
        return None  # no tenant: ``corral.in..submit`` reached a file replay as tenant ""
    return parts[2], parts[3]
