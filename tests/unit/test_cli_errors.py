"""The CLI's refusals that need no server: one line on stderr, exit status 2, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.services.cli import main as cli
from corral.services.cli import sim
from corral.services.sim.traces import philly


def test_the_demo_without_its_trace_says_where_to_find_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(philly, "DEFAULT", tmp_path / "nowhere" / "philly.csv")
    monkeypatch.setenv("CORRAL_TRACES", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", "--data", str(tmp_path / "demo")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "philly.csv not found" in err and "CORRAL_TRACES" in err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("flag", ["--nodes", "--pods", "--published"])
def test_a_missing_alibaba_file_is_named_even_where_no_trace_is(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sim, "SHARED", tmp_path / "nowhere")
    monkeypatch.setenv("CORRAL_TRACES", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(["sim", "--trace", "alibaba", flag, "typo.csv"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "corral: typo.csv: no such file\n"


NOWHERE = ("--server", "nats://127.0.0.1:1")  # refused before anything is sent: no server is there


def refused_for(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The command exits 2 with one line on stderr naming ``flag``."""
    with pytest.raises(SystemExit) as stop:
        cli.main([*argv, *NOWHERE])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}:" in err


@pytest.mark.parametrize("half_life", ["0", "-60", "inf", "nan", "-1h", "0m", "soon", "1h-"])
def test_a_half_life_that_is_no_positive_number_of_seconds_is_refused(
    half_life: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused_for(["queue", "fair-share", f"--half-life-s={half_life}"], "--half-life", capsys)


@pytest.mark.parametrize("short", ["-1", "inf", "nan", "-1h", "1x"])
def test_a_short_job_lane_that_is_no_amount_of_gpu_time_is_refused(
    short: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused_for(["queue", "fair-share", "--half-life=1d", f"--short-jobs={short}"], "--short-jobs", capsys)


@pytest.mark.parametrize("finished_s", ["-1", "inf", "nan", "-1h", "1x"])
def test_a_retention_that_is_no_number_of_seconds_is_refused(
    finished_s: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything is sent (the server named here is not there): 0 is allowed."""
    refused_for(["queue", "retention", f"--finished-s={finished_s}"], "--finished", capsys)


@pytest.mark.parametrize("most", ["0", "-5"])
def test_a_limit_of_no_job_per_tenant_is_refused(most: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused_for(
        ["queue", "retention", "--finished", "1h", f"--jobs-per-tenant={most}"], "--jobs-per-tenant", capsys
    )


def test_a_retention_of_0_is_sent(capsys: pytest.CaptureFixture[str]) -> None:
    """0 passes the CLI's check: what fails is reaching the server named."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["queue", "retention", "--finished", "0", "--server", "nats://127.0.0.1:1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--finished:" not in err and "127.0.0.1:1" in err


def test_a_gpu_nodes_agent_without_nvml_exits_with_why_and_offers_no_simulated_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.services.agent import discovery

    monkeypatch.setattr(discovery, "load_nvml", lambda: None)
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        cli.main(["serve", "agent", "--node", "gpu-1", "--gpus", "nvml", "--server", "nats://127.0.0.1:1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpus nvml" in err and "pynvml is not installed" in err


@pytest.mark.parametrize("where", ["file", "file/data"])
@pytest.mark.parametrize("auth", [[], ["--auth"]])
def test_a_data_directory_that_cannot_be_one_is_refused_before_anything_starts(
    where: str, auth: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("queues, not a corral\n")
    with pytest.raises(SystemExit) as stop:
        cli.main(["up", "--nodes", "1", "--data", str(tmp_path / where), *auth])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"corral: --data {tmp_path / where}: "), err
    assert (tmp_path / "file").read_text() == "queues, not a corral\n"


def test_a_data_directory_set_up_with_logins_is_not_started_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials.json").write_text('{"admin": "secret"}\n')
    with pytest.raises(SystemExit) as stop:
        cli.main(["up", "--nodes", "1", "--data", str(data)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set up with logins" in err and "--auth" in err, err
    assert sorted(p.name for p in data.iterdir()) == ["credentials.json"]


@pytest.mark.parametrize("where", [[], ["log.jsonl"]], ids=["server", "file"])
def test_a_negative_sequence_to_replay_until_is_refused(
    where: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    refused_for(["replay", *where, "--until=-5"], "--until", capsys)


@pytest.mark.parametrize("logins", [False, True])
def test_a_served_agent_with_a_login_runs_its_workers_as_corral_up_with_logins_does(
    logins: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With logins, tenants share the nodes: a served agent runs every worker sandboxed (or
    none), as an unprivileged user, shown only the system's directories, as ``corral up --auth``
    does. Run as the agent's own user with the host's whole root shown, a job read the files
    the agent may read (its login's password among them) and spoke for the node."""
    from corral.events import nats_client
    from corral.services.agent import service
    from corral.services.runtime import output

    built: dict[str, object] = {}

    class Built(Exception):
        pass

    class Connection:
        async def publish(self, *args: object, **kw: object) -> None:
            pass

        async def close(self) -> None:
            pass

    async def connect(*args: object, **kw: object) -> Connection:
        return Connection()

    def agent(*args: object, **kw: object) -> None:
        built.update(kw)
        raise Built

    monkeypatch.setattr(nats_client, "open_client", connect)
    monkeypatch.setattr(service, "NodeAgent", agent)
    monkeypatch.setattr(output, "JetStreamOutput", lambda nc: None)
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_CREDENTIALS", raising=False)
    if logins:
        monkeypatch.setenv("CORRAL_PASSWORD", "agent's")
    else:
        monkeypatch.delenv("CORRAL_PASSWORD", raising=False)
    with pytest.raises(Built):
        cli.main(["serve", "agent", "--node", "n1", "--server", "nats://127.0.0.1:1"])
    shown = {k: built.get(k) for k in ("sandbox", "worker_user", "narrow_view")}
    if logins:
        assert shown == {"sandbox": "bwrap", "worker_user": "nobody", "narrow_view": True}
    else:
        assert shown == {"sandbox": "auto", "worker_user": None, "narrow_view": False}


def test_a_served_agent_with_a_login_refuses_to_run_jobs_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With logins, no sandbox means no job (DESIGN §10): ``--sandbox none`` ran every worker
    with the host's whole root shown, as the agent's own user unless it ran as root, where a
    job read the agent's password (its environment, its credentials file) and spoke for the
    node. A served agent given a login refuses it, starting nothing."""
    from corral.events import nats_client
    from corral.services.agent import service

    built: list[object] = []

    async def connect(*args: object, **kw: object) -> None:
        built.append("a connection")
        raise OSError("nowhere to connect to")

    monkeypatch.setattr(nats_client, "open_client", connect)
    monkeypatch.setattr(service, "NodeAgent", lambda *a, **kw: built.append(kw))
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_CREDENTIALS", raising=False)
    monkeypatch.setenv("CORRAL_PASSWORD", "agent's")
    with pytest.raises(SystemExit) as stop:
        cli.main(["serve", "agent", "--node", "n1", "--server", "nats://127.0.0.1:1", "--sandbox", "none"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sandbox none" in err and "login" in err
    assert built == []
