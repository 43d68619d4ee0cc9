"""Whom a command speaks for (``services/cli/access.py``): a login speaks for its own tenant only,
as the server's permissions have it. Asked for another with ``--tenant``, the command waited for
answers the server would never let through, or printed an empty list and exited 0."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from corral.services.cli.access import Failure, admin_client, client_for, tenant_of


def args(tmp_path: Path, tenant: str | None, logins: dict[str, str]) -> argparse.Namespace:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(logins))
    path.chmod(0o600)
    return argparse.Namespace(tenant=tenant, user=None, credentials=str(path), server=None)


def test_a_tenants_login_asked_for_another_tenant_says_they_disagree(tmp_path: Path) -> None:
    mine = args(tmp_path, "team-b", {"team-a": "pw"})
    for make in (lambda a: client_for(a, reading=True), client_for, admin_client):
        with pytest.raises(Failure, match="--tenant team-b and the login team-a disagree"):
            make(mine)


def test_a_login_speaks_for_its_own_tenant(tmp_path: Path) -> None:
    assert client_for(args(tmp_path, None, {"team-a": "pw"}), reading=True).tenant == "team-a"
    assert client_for(args(tmp_path, "team-a", {"team-a": "pw"})).tenant == "team-a"
    # The operator's file of every login: --tenant picks that tenant's.
    every = {"team-a": "pa", "team-b": "pb", "admin": "px"}
    assert client_for(args(tmp_path, "team-b", every)).tenant == "team-b"
    # Without a login (a corral up without --auth), --tenant is whom it speaks for.
    free = argparse.Namespace(tenant="team-b", user=None, credentials=None, server=None)
    assert tenant_of(free) == "team-b"
