"""How the ``corral`` command reaches a corral, and as whom.

Which server: ``--server``, else ``$CORRAL_SERVER``, else the one ``corral up`` recorded in the
state directory, else the default port on this machine.

Who you are: nobody, on a server without logins; else the identity of ``--user`` (or
``$CORRAL_USER``, or the one login in the credentials file, or the one the command speaks for:
the tenant of ``--tenant``, ``admin`` for ``queue apply``, ``services`` for the log) with its
password from ``--credentials FILE`` (or ``$CORRAL_CREDENTIALS``, or ``$CORRAL_PASSWORD``). As a
tenant or ``admin`` the CLI only sends requests and asks the read service (``jobs``, ``explain``,
``queues``, ``nodes``); as ``services``, or with no login, it reads the log itself for
``queues``, ``nodes`` and the log verbs, and goes through the intake and the read service for
a job's verbs (``submit``, ``cancel``, ``resize``, ``jobs``, ``explain``) like everyone.

Three ways in: the log itself (``open_log``, the ``services`` login or none), the read service
(``ask``), and the Python client (``corral.services.client``), which sends a job's requests to
the intake and asks the read service for their verdict and for jobs and explanations, whatever
the login. A failure to get in is one ``Failure`` line for the person at the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.events import subjects
from corral.events.log import EventLog, Record
from corral.projections.fold import fold
from corral.projections.state import State
from corral.services.cli.jobfile import BadInput
from corral.services.client import Client
from corral.services.client.aio import default_server
from corral.services.query.client import Refused, Session, every_page
from corral.services.runtime import identities

if TYPE_CHECKING:
    from corral.events.jetstream import JetStreamLog

STATE_DIR = Path(os.environ.get("CORRAL_HOME", ".corral"))


class Failure(Exception):
    """A one-line error for the person at the terminal."""


def server_url(given: str | None) -> str:
    return given or default_server()


@dataclass(frozen=True)
class Login:
    user: str
    password: str

    @property
    def reads_log(self) -> bool:
        """Only the services identity may read the stream; everyone else asks the read service."""
        return self.user == identities.SERVICES


def login_of(args: argparse.Namespace, default: str | None = None) -> Login | None:
    """Who the command acts as (see the module's docstring); None: no login. A credentials file
    of one login is that identity's; in the operator's file of all, ``default`` picks one."""
    user: str | None = getattr(args, "user", None)
    path = getattr(args, "credentials", None)
    if path:
        try:
            passwords = identities.load(path)
        except identities.CredentialsError as e:
            raise Failure(str(e)) from None
        if user is None:
            user = next(iter(passwords)) if len(passwords) == 1 else default
        if user is None:
            raise Failure(f"{path} holds several logins: say which with --user (or --tenant)")
        if user not in passwords:
            raise Failure(f"no password for {user} in {path}")
        return Login(user, passwords[user])
    password = os.environ.get("CORRAL_PASSWORD")
    if password is None:
        return None
    user = user or default
    if user is None:
        raise Failure("$CORRAL_PASSWORD is set: say whose it is with --user or $CORRAL_USER")
    return Login(user, password)


def as_client(login: Login | None) -> Login | None:
    """The login if it is a tenant's or the admin's (who ask the read service), else None."""
    return login if login is not None and not login.reads_log else None


def needs_log(verb: str, login: Login | None, reads: str = "the whole log") -> None:
    """Refuse ``verb`` to a login that is not the services' (``reads``: what it reads that only
    they may)."""
    if login is not None and not login.reads_log:
        who = identities.SERVICES
        raise Failure(f"{verb} reads {reads}: it takes the {who} login, not {login.user}")


async def session(url: str, login: Login) -> Session:
    try:
        return await asyncio.wait_for(Session.open(url, login.user, login.password), timeout=10)
    except TimeoutError:
        raise Failure(f"cannot reach the corral server at {url}: no answer") from None
    except Refused as e:
        raise Failure(str(e)) from None


def ask(url: str, login: Login, question: str, job: str = "", everything: bool = False) -> dict[str, Any]:
    """The read service's answer, asked as ``login``."""
    return _asked(url, login, lambda s: s.ask(login.user, question, job=job, everything=everything))


def ask_every_page(url: str, login: Login, question: str) -> dict[str, Any]:
    """The read service's answer to a paged ``question`` (``nodes``, ``gpus``, ``jobs``), every page of it."""
    return _asked(url, login, lambda s: every_page(s, login.user, question))


def _asked(url: str, login: Login, asking: Callable[[Session], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        s = await session(url, login)
        try:
            return await asking(s)
        except Refused as e:
            raise Failure(str(e)) from None
        finally:
            await s.close()

    return asyncio.run(run())


OPEN_AGAIN_S = 1.0  # between a starting service's tries to open the log


async def open_log(
    url: str, login: Login | None = None, *, create: bool = False, reconnect: float = 0.0
) -> JetStreamLog:
    """The log at ``url`` (one server or several, comma separated); ``create``: make the stream
    if it is not there (only a command that sets a log up does, and only a login that may
    configure streams can). ``reconnect``: a long-running service's connection, which
    reconnects to any server of the list for that many seconds when it loses its own (0: a
    command's, which gives up at once)."""
    from nats import errors as nats_errors

    from corral.events.jetstream import JetStreamLog
    from corral.events.nats_client import reconnecting

    refused: list[Exception] = []

    async def quiet(e: Exception) -> None:
        # The one-line failure below says it (nats-py would print a traceback); a connection
        # that reconnects hears of a refused login only here, as the server's -ERR text.
        if isinstance(e, nats_errors.AuthorizationError) or "authorization violation" in str(e).lower():
            refused.append(e)

    creds: dict[str, Any] = {"user": login.user, "password": login.password} if login else {}
    once: dict[str, Any] = {"allow_reconnect": False, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.1}
    options = {**(reconnecting(reconnect) if reconnect else once), "connect_timeout": 3, "error_cb": quiet}
    # A service starting while its servers are away (restarting, a NATS cluster electing the
    # stream's leader) tries for as long as it would reconnect once running, then gives up.
    # A login refused is refused again: that is said at once.
    loop = asyncio.get_running_loop()
    until = loop.time() + reconnect
    said = False
    while True:
        try:
            return await asyncio.wait_for(
                JetStreamLog.connect(url, **creds, create=create, **options),
                timeout=10,
            )
        except Exception as e:  # nats-py raises its own family for refused connections
            e = refused[-1] if refused else e
            why = f"cannot reach the corral server at {url}: {str(e) or type(e).__name__}"
            if refused or loop.time() + OPEN_AGAIN_S >= until:
                raise Failure(why) from None
        if not said:
            said = True
            print(f"corral: {why}; trying again for {reconnect:g} s", file=sys.stderr, flush=True)
        await asyncio.sleep(OPEN_AGAIN_S)


async def read_all(log: EventLog, until: int | None = None) -> list[Record]:
    out: list[Record] = []
    async for batch in log.read(1, until):
        out.extend(batch)
    return out


async def remote_state(url: str, login: Login | None = None) -> State:
    log = await open_log(url, login)
    try:
        return fold(await read_all(log))
    finally:
        await log.close()


def tenant_of(args: argparse.Namespace, login: Login | None = None) -> str:
    """The tenant a request speaks for: ``--tenant``, else the tenant logged in, else 'default'."""
    client = as_client(login)
    tenant: str = args.tenant or (client.user if client is not None else "default")
    if not subjects.is_token(tenant):
        raise BadInput(f"tenant {tenant!r}: use letters, digits, '-' and '_'")
    _speaks_for(client, tenant)
    return tenant


def _speaks_for(client: Login | None, tenant: str) -> None:
    """A login speaks for its own tenant only (the server lets it publish nowhere else): asked
    for another, the command would wait for answers that never come, or read an empty list."""
    if client is not None and tenant != client.user:
        raise Failure(
            f"--tenant {tenant} and the login {client.user} disagree: a login speaks for its own "
            f"tenant only; leave out --tenant, or use {tenant}'s credentials"
        )


def client_for(args: argparse.Namespace, *, reading: bool = False) -> Client:
    """The Python client as the command's login, for its tenant. Reading with no login (or the
    services login) and no ``--tenant``, it asks as the admin: the whole cluster, as the
    operator at the machine expects."""
    login = login_of(args, args.tenant)
    if reading and args.tenant is None and as_client(login) is None:
        tenant = identities.ADMIN
    else:
        tenant = tenant_of(args, login)
    if login is None:
        return Client(server_url(args.server), tenant=tenant)
    return Client(server_url(args.server), tenant=tenant, user=login.user, password=login.password)


def admin_client(args: argparse.Namespace) -> Client:
    """The Python client as the admin (or as the tenant or login given, which the intake then
    refuses with the reason)."""
    login = login_of(args, identities.ADMIN)
    client = as_client(login)
    tenant = args.tenant or (client.user if client is not None else identities.ADMIN)
    _speaks_for(client, tenant)
    if login is None:
        return Client(server_url(args.server), tenant=tenant)
    return Client(server_url(args.server), tenant=tenant, user=login.user, password=login.password)


def answer_of(answer: dict[str, Any], key: str) -> Any:
    if "error" in answer:
        raise Failure(str(answer["error"]))
    return answer[key]
