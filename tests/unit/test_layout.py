"""The tree reads as the design (DESIGN.md §11): who may import whom.

``events`` is the language and imports nothing else of corral's; ``projections`` (the fold and
every rule below the services) imports only ``events``; a service imports ``events``,
``projections`` and the shared runtime, never another service, so a rule two services need has
to live below both. Each service is a package with a pure ``decide.py`` and a ``service.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("admission", "placer", "preemptor", "health", "agent", "assignments", "query", "intake")


def _imports(path: Path) -> set[str]:
    """Every corral module ``path`` imports, anywhere in it (also inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] == "corral"}


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _offending(folder: str, allowed: tuple[str, ...]) -> list[str]:
    out = []
    for path in _files(folder):
        for module in sorted(_imports(path)):
            if module != "corral" and not module.startswith(allowed):
                out.append(f"{path.relative_to(ROOT)}: {module}")
    return out


def test_events_import_nothing_else_of_corral() -> None:
    assert _offending("events", ("corral.events",)) == []


def test_projections_import_only_events() -> None:
    assert _offending("projections", ("corral.events", "corral.projections")) == []


@pytest.mark.parametrize("role", SERVICES)
def test_a_service_imports_no_other_service(role: str) -> None:
    allowed = ("corral.events", "corral.projections", "corral.services.runtime", f"corral.services.{role}")
    assert _offending(f"services/{role}", allowed) == []


def test_the_forecast_role_drives_the_simulator_and_no_service_itself() -> None:
    """It forecasts with the simulator (which runs the services' decide functions, as
    ``corral sim`` does), and imports no service's shell."""
    allowed = (
        "corral.events",
        "corral.projections",
        "corral.services.runtime",
        "corral.services.sim",
        "corral.services.forecast",
    )
    assert _offending("services/forecast", allowed) == []


@pytest.mark.parametrize("role", (*SERVICES, "forecast"))
def test_a_service_is_a_pure_decide_and_a_shell(role: str) -> None:
    decide = ROOT / "services" / role / "decide.py"
    assert decide.exists() and (ROOT / "services" / role / "service.py").exists()
    # decide.py is pure: no asyncio, no clock, no IO modules
    impure = {"asyncio", "time", "socket", "subprocess", "os", "nats", "aiosqlite"}
    tree = ast.parse(decide.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names & impure == set()
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.Await)]


def test_no_bare_package_names_anywhere() -> None:
    """The lint rule's twin, for the tests and benchmarks too: nothing imports a bare name."""
    bare = ("events", "projections", "services")
    found = []
    for folder in ("events", "projections", "services", "tests", "bench", "corral"):
        for path in _files(folder):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in bare]
    assert found == []
