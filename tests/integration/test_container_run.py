"""Image jobs in real containers: the worker contract inside (environment, working directory,
data mounts, checkpoint directory, logs, exit codes), checkpoint requests and stops sent by
container name, start failures in the engine's own words, and no container left behind.

How a container runs here, with nothing from a registry: a root filesystem holding a static
busybox (Debian's ``busybox-static``) is packed into a tarball and imported as an image
(``<engine> import rootfs.tar localhost/corral-busybox:test``); then the launcher's own command
line runs ``/bin/true`` in it. If any step fails, these tests are skipped with that step's error.
On Debian 12: ``apt-get install -y podman runc busybox-static``. The one thing podman 4.3 needs
there, where the agent runs as root without CAP_SYS_RESOURCE, is limits no higher than the
agent's own (``podman_ulimits``); without them every start fails with ``error setting rlimit
type 7: operation not permitted``.

The test that an image job never runs on the host without an engine needs no engine at all and
always runs. Nothing sleeps: each test waits for the runtime's next report with a timeout.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from corral.events.jobs import Mount
from corral.services.agent import container, handover
from corral.services.agent.container import EngineInfo
from corral.services.agent.decide import (
    Checkpointed,
    Exited,
    Started,
    StartFailed,
    StartWorker,
    StopWorker,
    WorkerKey,
)
from corral.services.agent.worker import REQUEST, log_path
from corral.services.agent.workers import Runtime
from tests.integration import polling
from tests.integration.test_agent_runtime import exit_of, until

# Container names are one namespace for the user's engine, and this module's jobs share ids:
# its tests run one at a time, in one test process (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("containers")

WAIT = 60.0
IMAGE = "localhost/corral-busybox:test"
APPLETS = ("sh", "true", "echo", "cat", "mv", "sleep", "pwd", "env", "touch", "ls", "test", "[", "printf")


def ran(report: object) -> object:
    """An exit report without the pid it carries (each run's own), to compare with an expected one."""
    return msgspec.structs.replace(report, pid=0) if isinstance(report, Exited) else report


def _build_image(engine: EngineInfo, scratch: Path) -> str:
    """Import a busybox image and run the launcher's command line in it; ``""`` when that
    works, else what failed."""
    busybox = shutil.which("busybox-static") or shutil.which("busybox")
    if busybox is None:
        return "no busybox to build an image from (apt-get install -y busybox-static)"
    root = scratch / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "dev", "sys"):
        (root / d).mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    with tarfile.open(scratch / "rootfs.tar", "w") as tar:
        tar.add(root, arcname=".")
    imported = subprocess.run(
        [engine.path, "import", str(scratch / "rootfs.tar"), IMAGE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if imported.returncode != 0:
        return f"{engine.name} import failed: {imported.stderr.strip() or imported.stdout.strip()}"
    work = scratch / "work"
    work.mkdir()
    # Every test process looks at collection: a name of its own (two probes of one name, at
    # once, had one of them skip every container test).
    probe = f"probe-{os.getpid()}"
    trial = StartWorker(probe, 0, 0, (), {}, ("/bin/true",), str(work), str(work), image=IMAGE)
    argv = container.run_args(
        engine.name,
        trial,
        agent="probe",
        workdir=str(work),
        env={},
        ulimits=_ulimits(engine),
        exe=engine.path,
    )
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if ran.returncode != 0:
        return f"{engine.name} cannot run a container here: {(ran.stderr or ran.stdout).strip()}"
    return ""


def _ulimits(engine: EngineInfo) -> dict[str, tuple[int, int]] | None:
    import resource

    if engine.name != "podman":
        return None
    return container.podman_ulimits(
        resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_NPROC)
    )


def _detect() -> tuple[EngineInfo | None, str]:
    found = asyncio.run(container.probe("auto"))
    if found.engine is None:
        return None, f"no container engine answers here: {found.why}"
    with tempfile.TemporaryDirectory(prefix="corral-image-") as scratch:
        why = _build_image(found.engine, Path(scratch))
    return (None, why) if why else (found.engine, "")


ENGINE, WHY_NOT = _detect()  # at collection time: every container test is skipped with the reason
needs_engine = pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)


def spec_for(tmp: Path, job_id: str, command: list[str], rank: int = 0, **kw: object) -> StartWorker:
    ckpt = tmp / "ckpt" / job_id
    own = ckpt / f"attempt-0/rank-{rank}"
    base = StartWorker(
        job_id=job_id,
        attempt=0,
        rank=rank,
        gpus=(),
        env={
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "node-00",
            "MASTER_PORT": "23456",
            "CORRAL_JOB_ID": job_id,
            "CORRAL_ATTEMPT": "0",
            "CORRAL_CHECKPOINT_DIR": str(own),
        },
        command=tuple(command),
        checkpoint_dir=str(own),
        job_checkpoint_dir=str(ckpt),
        image=IMAGE,
        grace_seconds=5.0,
    )
    return msgspec.structs.replace(base, **kw)


async def start_one(rt: Runtime, s: StartWorker) -> None:
    result = await rt.start_gang([s], timeout=WAIT)
    assert result.failed is None, result.reason
    assert await until(rt, lambda r: isinstance(r, Started))


def containers_of(job_id: str) -> list[str]:
    assert ENGINE is not None
    listed = subprocess.run(
        [ENGINE.path, "ps", "-a", "--filter", f"label=corral.job={job_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return listed.stdout.split()


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    assert ENGINE is not None
    rt = Runtime(tmp_path / "agent", containers=ENGINE.name, node="node-00", poll_interval=0.02)
    try:
        yield rt
    finally:
        await rt.close(grace=2.0)


# -- without an engine ------------------------------------------------------------------------------


def fake_engine(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


async def test_an_image_job_with_no_engine_fails_to_start_and_never_runs_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_engine(
        bin_dir,
        "docker",
        'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. '
        'Is the docker daemon running?" >&2; exit 1',
    )
    monkeypatch.setenv("PATH", str(bin_dir))  # docker without a daemon, and no podman
    marker = tmp_path / "ran-on-the-host"
    rt = Runtime(tmp_path / "agent", sandbox="none", node="node-07")
    try:
        s = spec_for(tmp_path, "img", ["/bin/sh", "-c", f"touch {marker}"])
        result = await rt.start_gang([s], timeout=WAIT)
        reason = (
            f"image {IMAGE} needs podman or docker, none can run containers on node node-07: "
            "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
            "daemon running?; podman is not installed"
        )
        assert result.failed == s.key and result.reason == reason
        # No engine works here: what the job asks of a node that does not offer it, its own to
        # fail (a node without one is no broken node for a quarantine to take).
        assert await rt.next_report(WAIT) == StartFailed(s.key, reason)
        assert rt.workers() == {s.key: "exited"}
    finally:
        await rt.close(grace=2.0)
    assert not marker.exists()
    assert not log_path(rt.root, s.key, s.run).exists()  # nothing was started to write one


# -- the contract inside a container --------------------------------------------------------------

CONTRACT = r"""
for k in RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT CORRAL_JOB_ID CORRAL_CHECKPOINT_DIR \
         NVIDIA_VISIBLE_DEVICES PYTHONUNBUFFERED; do
  eval "echo $k=\$$k"
done
echo "cwd=$(pwd)"
echo "data=$(cat /data/in/words.txt)"
if touch /data/in/new.txt 2>/dev/null; then echo "ro=writable"; else echo "ro=refused"; fi
echo written > /scratch/out/result.txt && echo "rw=writable"
touch "$CORRAL_CHECKPOINT_DIR/state" && echo "ckpt=writable"
echo "to stderr" >&2
exit 3
"""


@needs_engine
async def test_a_container_worker_gets_the_contract_and_its_exit_code(
    runtime: Runtime, tmp_path: Path
) -> None:
    data, out = tmp_path / "dataset", tmp_path / "results"
    data.mkdir()
    out.mkdir()
    (data / "words.txt").write_text("hello from the dataset\n")
    mounts = (Mount(str(data), "/data/in"), Mount(str(out), "/scratch/out", read_only=False))
    s = spec_for(tmp_path, "contract", ["/bin/sh", "-c", CONTRACT], mounts=mounts)
    await start_one(runtime, s)
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 3, stopped=False)
    printed = log_path(runtime.root, s.key, s.run).read_text()
    seen = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    workdir = runtime.root / "work" / "contract" / "run-0" / "attempt-0" / "rank-0"
    assert seen == {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "node-00",
        "MASTER_PORT": "23456",
        "CORRAL_JOB_ID": "contract",
        "CORRAL_CHECKPOINT_DIR": s.checkpoint_dir,
        "NVIDIA_VISIBLE_DEVICES": "void",
        "PYTHONUNBUFFERED": "1",
        "cwd": str(workdir),
        "data": "hello from the dataset",
        "ro": "refused",
        "rw": "writable",
        "ckpt": "writable",
    }
    assert "to stderr" in log_path(runtime.root, s.key, s.run).read_text()
    assert (out / "result.txt").read_text() == "written\n" and not (data / "new.txt").exists()
    assert (Path(s.checkpoint_dir) / "state").exists()  # the host sees what the worker saved
    assert containers_of("contract") == []  # removed once it exited


AS_USER = r"""
echo "uid=$(id -u) gid=$(id -g)"
grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -d '\t'
touch "$CORRAL_CHECKPOINT_DIR/state" && echo ckpt=writable
"""


@needs_engine
async def test_where_tenants_share_nodes_a_container_runs_as_the_workers_user(tmp_path: Path) -> None:
    """An image's own user (root, as most are) does not hold where workers run as an unprivileged
    user: the container runs as that user, with no capability and no way to gain privileges,
    and writes its own directories, which are handed to it."""
    assert ENGINE is not None
    if os.geteuid() != 0:
        pytest.skip("only a root agent starts workers as another user")
    rt = Runtime(
        tmp_path / "agent", containers=ENGINE.name, node="node-00", poll_interval=0.02, worker_user="nobody"
    )
    s = spec_for(tmp_path, "as-user", ["/bin/sh", "-c", AS_USER])
    try:
        await start_one(rt, s)
        [exited] = await until(rt, exit_of(s.key))
    finally:
        await rt.close(grace=2.0)
    lines = log_path(rt.root, s.key, s.run).read_text().splitlines()
    nobody = pwd.getpwnam("nobody")
    assert ran(exited) == Exited(s.key, 0, stopped=False), lines
    assert f"uid={nobody.pw_uid} gid={nobody.pw_gid}" in lines
    assert "CapEff:0000000000000000" in lines and "NoNewPrivs:1" in lines and "ckpt=writable" in lines


# -- checkpoints and stops, by container name -----------------------------------------------------

# Checkpoints on SIGUSR1: saves "the deadline it was given" (REQUEST) as its location, writes DONE
# atomically, and exits 0 on SIGTERM, as a checkpointed worker should.
CHECKPOINTER = r"""
d="$CORRAL_CHECKPOINT_DIR"
save() {
  printf '{"step": 7, "location": "%s"}' "$(cat "$d/REQUEST")" > "$d/done.tmp"
  mv "$d/done.tmp" "$d/DONE"
}
trap save USR1
trap 'exit 0' TERM
while true; do sleep 0.05; done
"""


@needs_engine
async def test_a_checkpoint_request_reaches_the_worker_and_a_stop_ends_it(
    runtime: Runtime, tmp_path: Path
) -> None:
    s = spec_for(tmp_path, "ckpt", ["/bin/sh", "-c", CHECKPOINTER])
    await start_one(runtime, s)
    pid = runtime.pid(s.key)
    assert pid is not None and pid != os.getpid()
    await runtime.request_checkpoint(s.key, 1234.5)
    assert (Path(s.checkpoint_dir) / REQUEST).read_text() == "1234.500\n"
    assert await runtime.next_report(WAIT) == Checkpointed(s.key, 7, "1234.500")
    assert runtime.workers()[s.key] == "checkpointed"
    await runtime.act(StopWorker(s.key, "preempted", grace=WAIT))
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 0, stopped=True)
    assert containers_of("ckpt") == []


@needs_engine
async def test_a_worker_ignoring_sigterm_is_killed_after_its_grace(runtime: Runtime, tmp_path: Path) -> None:
    s = spec_for(tmp_path, "stubborn", ["/bin/sh", "-c", "trap '' TERM; while true; do sleep 0.05; done"])
    await start_one(runtime, s)
    await runtime.stop(s.key, grace=0.5)
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 128 + signal.SIGKILL, stopped=True)
    assert containers_of("stubborn") == []


@needs_engine
async def test_a_worker_killed_from_outside_reports_128_plus_the_signal(
    runtime: Runtime, tmp_path: Path
) -> None:
    s = spec_for(tmp_path, "crash", ["/bin/sh", "-c", "while true; do sleep 0.05; done"])
    await start_one(runtime, s)
    pid = runtime.pid(s.key)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the worker's own host process: a crash, not a stop
    [exited] = await until(runtime, exit_of(s.key))
    assert ran(exited) == Exited(s.key, 128 + signal.SIGKILL, stopped=False)


# -- failures and leftovers -----------------------------------------------------------------------


@needs_engine
async def test_an_image_that_cannot_be_had_fails_to_start_in_the_engines_words(
    runtime: Runtime, tmp_path: Path
) -> None:
    assert ENGINE is not None
    s = spec_for(tmp_path, "missing", ["/bin/true"], image="localhost/corral-missing:none")
    result = await runtime.start_gang([s], timeout=WAIT)
    assert result.failed == s.key
    prefix = f"{ENGINE.name} could not run image localhost/corral-missing:none on node node-00: "
    assert result.reason.startswith(prefix) and container.engine_error(result.reason[len(prefix) :])
    assert await runtime.next_report(WAIT) == StartFailed(s.key, result.reason)


@needs_engine
async def test_closing_the_runtime_stops_its_containers(tmp_path: Path) -> None:
    assert ENGINE is not None
    rt = Runtime(tmp_path / "agent", containers=ENGINE.name, node="node-00", poll_interval=0.02)
    s = spec_for(tmp_path, "closing", ["/bin/sh", "-c", "while true; do sleep 0.05; done"])
    await start_one(rt, s)
    assert containers_of("closing") == [container.container_name("closing", 0, 0, agent=rt.agent_id())]
    await rt.close(grace=0.0)  # as when the agent crashes
    assert ran(await rt.next_report(WAIT)) == Exited(s.key, 128 + signal.SIGKILL, stopped=True)
    assert containers_of("closing") == []


@needs_engine
async def test_a_container_lost_with_an_earlier_agent_is_removed_when_reported_gone(
    runtime: Runtime, tmp_path: Path
) -> None:
    assert ENGINE is not None
    name = container.container_name("lost", 1, 0, agent=runtime.agent_id())
    argv = [ENGINE.path, "run", "-d", "--name", name, "--label", "corral.job=lost"]
    argv += [f"--ulimit={k}={a}:{b}" for k, (a, b) in (_ulimits(ENGINE) or {}).items()]
    started = subprocess.run([*argv, IMAGE, "/bin/sleep", "600"], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    runtime.report_gone(WorkerKey("lost", 1, 0))
    assert await runtime.next_report(WAIT) == Exited(WorkerKey("lost", 1, 0), -1)
    await runtime.close()  # waits for the removal it started
    assert containers_of("lost") == []


# -- two corrals on one host ----------------------------------------------------------------------


def running_containers_of(job_id: str) -> list[str]:
    assert ENGINE is not None
    listed = subprocess.run(
        [ENGINE.path, "ps", "--filter", f"label=corral.job={job_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return sorted(listed.stdout.split())


@needs_engine
async def test_agents_of_two_corrals_on_one_host_never_touch_each_others_containers(
    tmp_path: Path,
) -> None:
    """Job ids are unique within one corral only: a staging and a production corral on one GPU
    host may each run job ``twin``, attempt 0, rank 0, at once. Neither agent's start, restart,
    clean-up of a worker lost with an earlier agent, or stop reaches the other's container."""
    assert ENGINE is not None
    forever = ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.05; done"]

    def runtime_of(corral: str) -> Runtime:
        assert ENGINE is not None
        return Runtime(tmp_path / corral / "agent", containers=ENGINE.name, node="gpu-1", poll_interval=0.02)

    staging, production = runtime_of("staging"), runtime_of("production")
    ours, theirs = (
        spec_for(tmp_path / "staging", "twin", forever),
        spec_for(tmp_path / "production", "twin", forever),
    )
    key = ours.key
    restarted: Runtime | None = None
    try:
        await start_one(staging, ours)
        await start_one(production, theirs)  # a leftover of the same name would be removed first
        assert len(running_containers_of("twin")) == 2
        assert staging.workers() == {key: "running"} and staging.reports.empty()

        # Staging's agent restarts, takes its worker back, and a third corral's agent on this
        # host reports a worker of the same key lost with its own predecessor.
        await staging.leave()
        restarted = runtime_of("staging")
        assert restarted.reattach() == [key]
        third = runtime_of("third")
        third.report_gone(key)
        assert await third.next_report(WAIT) == Exited(key, -1)
        await third.close()  # waits for the removal it started
        assert len(running_containers_of("twin")) == 2

        # Staging stops its own worker: production's runs on.
        await restarted.stop(key, grace=WAIT)
        *_, exited = await until(restarted, exit_of(key))  # after its start, told again
        assert ran(exited) == Exited(key, 0, stopped=True)
        assert running_containers_of("twin") == [container.container_name(*key, agent=production.agent_id())]
        assert production.workers() == {key: "running"} and production.reports.empty()
    finally:
        for rt in (restarted, production, staging):
            if rt is not None:
                await rt.close(grace=2.0)
        for name in containers_of("twin"):  # whatever a failure left behind
            subprocess.run([ENGINE.path, "rm", "--force", name], capture_output=True, timeout=60)


@needs_engine
async def test_a_container_named_by_an_older_agent_is_removed_by_the_name_its_record_kept(
    tmp_path: Path,
) -> None:
    """An agent of an earlier version named its containers without its work directory's id
    (``corral-<job>-a<attempt>-r<rank>``). Upgraded and restarted on the same work directory, the
    agent reaches such a container by the name the worker's record kept: one whose keeper is
    gone is removed, not left holding its GPUs."""
    assert ENGINE is not None
    before = Runtime(tmp_path / "agent", containers=ENGINE.name, node="gpu-1", poll_interval=0.02)
    s = spec_for(tmp_path, "older", ["/bin/sh", "-c", "while true; do sleep 0.05; done"])
    old_name = "corral-older-a0-r0"
    try:
        await start_one(before, s)
        await before.leave()
        renamed = subprocess.run(
            [ENGINE.path, "rename", container.container_name(*s.key, agent=before.agent_id()), old_name],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert renamed.returncode == 0, renamed.stderr
        [kept] = handover.kept(before.root, set())
        record = msgspec.structs.replace(kept.record, container=old_name)
        handover.save(handover.keeper_dir(before.root, s.key), record)
        assert kept.keeper_id is not None
        os.kill(kept.keeper_id[0], signal.SIGKILL)  # the worker's keeper is gone, without an exit
        # No event tells a process's end to a non-parent: its end is looked for until it comes.
        await polling.until(lambda: not handover.alive(kept.keeper_id, kept.boot), WAIT)
        after = Runtime(tmp_path / "agent", containers=ENGINE.name, node="gpu-1", poll_interval=0.02)
        assert after.reattach() == []
        await after.close()  # waits for the removal it started
        assert containers_of("older") == []
    finally:
        for name in containers_of("older"):  # whatever a failure left behind
            subprocess.run([ENGINE.path, "rm", "--force", name], capture_output=True, timeout=60)
