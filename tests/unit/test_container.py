"""The container launcher's command lines: what ``podman run`` / ``docker run`` is given for a
worker (name, labels, host network, init, environment, mounts, GPUs as CDI devices, limits),
how a container is signalled, stopped and removed by name, and how the engine is chosen.

Everything here is pure except ``probe``, which is given fake engines (small shell scripts)."""

from __future__ import annotations

import re
import signal
import stat
from pathlib import Path

import msgspec
import pytest

from corral.events.decisions import MigSlot
from corral.events.jobs import Mount
from corral.projections.assignments import GpuBinding
from corral.services.agent import container
from corral.services.agent.container import (
    EngineInfo,
    Probe,
    cdi_device,
    container_env,
    container_name,
    engine_error,
    gpu_devices,
    kill_args,
    mount_problem,
    pid_args,
    podman_ulimits,
    probe,
    remove_args,
    run_args,
    stop_args,
)
from corral.services.agent.decide import StartWorker

WORK = "/var/lib/corral/work/train/attempt-2/rank-1"
AGENT = "0123456789ab"  # the id of the agent's work directory (``container.agent_id``)


def spec(**kw: object) -> StartWorker:
    base = StartWorker(
        job_id="train",
        attempt=2,
        rank=1,
        gpus=(),
        env={"RANK": "1", "CORRAL_CHECKPOINT_DIR": "/ckpt/train/attempt-2/rank-1"},
        command=("python", "train.py", "--steps", "100"),
        checkpoint_dir="/ckpt/train/attempt-2/rank-1",
        job_checkpoint_dir="/ckpt/train",
        image="registry.local/team/train:1.0",
        grace_seconds=30.0,
    )
    return msgspec.structs.replace(base, **kw)


def pairs(args: list[str], flag: str) -> list[str]:
    """Every value given to ``flag``, in order."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


# -- the whole command line -------------------------------------------------------------------------


def test_a_podman_run_reads_as_the_worker_contract() -> None:
    env = container_env({"RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "21234"})
    args = run_args(
        "podman",
        spec(mounts=(Mount("/datasets/imagenet", "/data"),)),
        agent=AGENT,
        workdir=WORK,
        env=env,
        devices=["nvidia.com/gpu=3"],
        ulimits={"nofile": (1024, 20000), "nproc": (32768, 32768)},
    )
    assert args == [
        "podman", "run", "--rm", "--name", "corral-0123456789ab-train-a2-r1", "--cap-drop", "MKNOD",
        "--label", "corral.agent=0123456789ab", "--label", "corral.job=train",
        "--label", "corral.attempt=2", "--label", "corral.rank=1",
        "--network", "host", "--ipc", "host", "--init", "--stop-timeout", "30", "--pids-limit=-1",
        "--log-driver", "none",
        "--ulimit", "nofile=1024:20000", "--ulimit", "nproc=32768:32768",
        "--device", "nvidia.com/gpu=3",
        "-e", "MASTER_ADDR=10.0.0.5", "-e", "MASTER_PORT=21234", "-e", "NVIDIA_VISIBLE_DEVICES=void",
        "-e", "PYTHONUNBUFFERED=1", "-e", "RANK=1",
        "-v", f"{WORK}:{WORK}", "-v", "/ckpt/train:/ckpt/train", "-v", "/datasets/imagenet:/data:ro",
        "-w", WORK,
        "registry.local/team/train:1.0", "python", "train.py", "--steps", "100",
    ]  # fmt: skip


def test_docker_gets_no_podman_only_flags_and_the_resolved_executable() -> None:
    args = run_args("docker", spec(), agent=AGENT, workdir=WORK, env={}, exe="/usr/local/bin/docker")
    assert args[:2] == ["/usr/local/bin/docker", "run"]
    assert "--log-driver" not in args and "--ulimit" not in args
    assert args[-5:] == ["registry.local/team/train:1.0", "python", "train.py", "--steps", "100"]


def test_a_job_without_a_command_runs_the_images_own() -> None:
    args = run_args("podman", spec(command=()), agent=AGENT, workdir=WORK, env={})
    assert args[-3:] == ["-w", WORK, "registry.local/team/train:1.0"]


@pytest.mark.parametrize(
    ("grace", "flag"),
    [(30.0, "30"), (0.3, "1"), (0.0, "0"), (12.5, "13")],
    ids=["whole", "part", "none", "up"],
)
def test_the_stop_timeout_is_the_grace_rounded_up(grace: float, flag: str) -> None:
    args = run_args("podman", spec(grace_seconds=grace), agent=AGENT, workdir=WORK, env={})
    assert pairs(args, "--stop-timeout") == [flag]


# -- environment ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_env", "want"),
    [
        ({}, {"PYTHONUNBUFFERED": "1", "NVIDIA_VISIBLE_DEVICES": "void"}),
        ({"PYTHONUNBUFFERED": "0"}, {"PYTHONUNBUFFERED": "0", "NVIDIA_VISIBLE_DEVICES": "void"}),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, {"PYTHONUNBUFFERED": "1", "NVIDIA_VISIBLE_DEVICES": "void"}),
        ({"A": "x=y z"}, {"PYTHONUNBUFFERED": "1", "A": "x=y z", "NVIDIA_VISIBLE_DEVICES": "void"}),
    ],
    ids=["contract-only", "job-may-buffer", "never-every-gpu", "value-kept-whole"],
)
def test_container_environment(job_env: dict[str, str], want: dict[str, str]) -> None:
    assert container_env(job_env) == want


def test_every_variable_is_one_e_flag_in_name_order_and_no_host_path_leaks() -> None:
    env = container_env({"WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "EMPTY": ""})
    got = pairs(run_args("podman", spec(), agent=AGENT, workdir=WORK, env=env), "-e")
    assert got == [
        "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b", "EMPTY=", "NVIDIA_VISIBLE_DEVICES=void",
        "PYTHONUNBUFFERED=1", "WORLD_SIZE=2",
    ]  # fmt: skip
    assert not any(v.startswith("PATH=") for v in got)


# -- mounts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mounts", "want"),
    [
        ((), []),
        ((Mount("/d", "/data"),), ["/d:/data:ro"]),
        ((Mount("/out", "/scratch/out", read_only=False),), ["/out:/scratch/out"]),
        (
            (Mount("/d", "/data"), Mount("/out", "/out", read_only=False)),
            ["/d:/data:ro", "/out:/out"],
        ),
    ],
    ids=["none", "read-only", "read-write", "both-in-order"],
)
def test_data_mounts_follow_the_workdir_and_the_checkpoints(
    mounts: tuple[Mount, ...], want: list[str]
) -> None:
    got = pairs(run_args("podman", spec(mounts=mounts), agent=AGENT, workdir=WORK, env={}), "-v")
    assert got == [f"{WORK}:{WORK}", "/ckpt/train:/ckpt/train", *want]


@pytest.mark.parametrize(
    ("mount", "problem"),
    [
        (Mount("/d", "/data"), ""),
        (Mount("/d", "/scratch/deep/dir", read_only=False), ""),
        (Mount("/d", "data"), "absolute path"),
        (Mount("/d", "/"), "absolute path"),
        (Mount("/d", "/data/../etc"), "absolute path"),
        (Mount("/d", "/proc/x"), "hide the container's /proc"),
        (Mount("/d", "/dev"), "hide the container's /dev"),
        (Mount("/a:b", "/data"), "':' or ','"),
        (Mount("/d", "/data,ro"), "':' or ','"),
    ],
    ids=["plain", "nested-rw", "relative", "root", "dotdot", "proc", "dev", "colon", "comma"],
)
def test_mount_problems(mount: Mount, problem: str) -> None:
    got = mount_problem(mount)
    assert (problem in got and got) if problem else got == ""


# -- GPUs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "mig", "name"),
    [(0, None, "nvidia.com/gpu=0"), (7, None, "nvidia.com/gpu=7"), (1, 0, "nvidia.com/gpu=1:0"),
     (3, 2, "nvidia.com/gpu=3:2"), ("GPU-1a2b", None, "nvidia.com/gpu=GPU-1a2b"),
     ("all", None, "nvidia.com/gpu=all")],
    ids=["first", "eighth", "mig-first", "mig-third", "by-uuid", "all"],
)  # fmt: skip
def test_cdi_device_names(gpu: int | str, mig: int | None, name: str) -> None:
    assert cdi_device(gpu, mig) == name


MIG = {("GPU-p", 4): "MIG-4444", ("GPU-p", 0): "1:0"}


@pytest.mark.parametrize(
    ("gpus", "want"),
    [
        ((), []),
        ((GpuBinding(0, "GPU-a"), GpuBinding(5, "GPU-f")), ["nvidia.com/gpu=0", "nvidia.com/gpu=5"]),
        ((GpuBinding(2, "GPU-c", milli=250),), ["nvidia.com/gpu=2"]),
        ((GpuBinding(2, "GPU-c", milli=250), GpuBinding(2, "GPU-c", milli=250)), ["nvidia.com/gpu=2"]),
        ((GpuBinding(1, "GPU-p", mig=MigSlot("3g.40gb", 4)),), ["nvidia.com/gpu=MIG-4444"]),
        ((GpuBinding(1, "GPU-p", mig=MigSlot("1g.10gb", 0)),), ["nvidia.com/gpu=1:0"]),
    ],
    ids=["no-gpu", "two-whole", "a-share", "two-shares-one-device", "mig-by-uuid", "mig-by-index"],
)
def test_gpu_devices(gpus: tuple[GpuBinding, ...], want: list[str]) -> None:
    assert gpu_devices(gpus, MIG) == want


def test_a_mig_slot_without_an_instance_gets_no_device_at_all() -> None:
    with pytest.raises(LookupError, match="3g.40gb at slice 0 of GPU 1 does not exist"):
        gpu_devices((GpuBinding(1, "GPU-q", mig=MigSlot("3g.40gb", 0)),), MIG)


def test_devices_are_passed_in_order() -> None:
    args = run_args(
        "docker",
        spec(),
        agent=AGENT,
        workdir=WORK,
        env={},
        devices=["nvidia.com/gpu=1", "nvidia.com/gpu=1:0"],
    )
    assert pairs(args, "--device") == ["nvidia.com/gpu=1", "nvidia.com/gpu=1:0"]


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "attempt", "rank", "name"),
    [
        ("train", 0, 0, "corral-0123456789ab-train-a0-r0"),
        ("llama-70b.v2_run", 3, 15, "corral-0123456789ab-llama-70b.v2_run-a3-r15"),
        ("team/a b", 1, 0, "corral-0123456789ab-team-a-b-b1c076eb-a1-r0"),
        ("-x", 0, 0, "corral-0123456789ab--x-a0-r0"),
    ],
    ids=["simple", "dots-and-underscores", "odd-characters", "leading-dash"],
)
def test_container_names(job: str, attempt: int, rank: int, name: str) -> None:
    assert container_name(job, attempt, rank, agent=AGENT) == name


def test_names_differ_by_attempt_rank_and_jobs_that_look_alike() -> None:
    names = {
        container_name("j", 0, 0, agent=AGENT),
        container_name("j", 1, 0, agent=AGENT),
        container_name("j", 0, 1, agent=AGENT),
        container_name("a/b", 0, 0, agent=AGENT),
        container_name("a b", 0, 0, agent=AGENT),
        container_name("x" * 200, 0, 0, agent=AGENT),
        container_name("x" * 201, 0, 0, agent=AGENT),
    }
    assert len(names) == 7
    assert all(len(n) < 128 for n in names)


# -- whose containers -----------------------------------------------------------------------------


def test_one_job_of_two_corrals_on_one_host_gets_two_names_and_labels() -> None:
    """Job ids are unique within one corral only; an engine's names are one namespace for the
    host. Each agent's containers carry its work directory's id, in the name and a label."""
    ours, theirs = AGENT, "ba9876543210"
    assert container_name("train", 2, 1, agent=ours) != container_name("train", 2, 1, agent=theirs)
    for agent in (ours, theirs):
        args = run_args("podman", spec(), agent=agent, workdir=WORK, env={})
        assert pairs(args, "--name") == [container_name("train", 2, 1, agent=agent)]
        assert f"corral.agent={agent}" in pairs(args, "--label")


def test_a_work_directorys_id_is_made_once_and_kept(tmp_path: Path) -> None:
    first = container.agent_id(tmp_path / "node-a")
    assert container.agent_id(tmp_path / "node-a") == first  # an agent restarted on it
    assert (tmp_path / "node-a" / container.AGENT_ID_FILE).read_text() == f"{first}\n"
    assert container.agent_id(tmp_path / "node-b") != first  # another corral's agent
    # A valid container name whatever the job, and short.
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", container_name("x" * 300, 0, 0, agent=first))
    assert len(container_name("x" * 300, 99, 999, agent=first)) < 128
    assert sorted(p.name for p in (tmp_path / "node-a").iterdir()) == [container.AGENT_ID_FILE]


@pytest.mark.parametrize("damaged", [b"not an id\n", b"\xff\xfe\x00garbage"], ids=["text", "not-text"])
def test_a_damaged_id_is_made_again(tmp_path: Path, damaged: bytes) -> None:
    # Not text at all, it raised UnicodeDecodeError, which no caller takes for the OSError of
    # an id that cannot be kept: every container start here failed as the job's own fault.
    (tmp_path / container.AGENT_ID_FILE).write_bytes(damaged)
    made = container.agent_id(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", made) and container.agent_id(tmp_path) == made


def test_two_agents_making_the_id_at_once_keep_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two agents found no id and each made one: the second replaced the first's, which the
    # first had already named its containers by, and after its restart it never found them.
    # Here the other agent's id lands between this agent's look and its own write.
    path = tmp_path / container.AGENT_ID_FILE
    read = Path.read_text
    looked: list[Path] = []

    def first_look_finds_none(self: Path, *args: object, **kw: object) -> str:
        if self == path and not looked:
            looked.append(self)
            path.write_text("0a1b2c3d4e5f\n")  # the other agent's, made meanwhile
            raise FileNotFoundError(self)
        return read(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", first_look_finds_none)
    assert container.agent_id(tmp_path) == "0a1b2c3d4e5f"
    assert read(path) == "0a1b2c3d4e5f\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [container.AGENT_ID_FILE]


# -- signals, stops, removal, inspection ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (stop_args("podman", "c", 30.0), ["podman", "stop", "-t", "30", "c"]),
        (stop_args("docker", "c", 0.2), ["docker", "stop", "-t", "1", "c"]),
        (stop_args("podman", "c", 0.0), ["podman", "stop", "-t", "0", "c"]),
        (kill_args("podman", "c", signal.SIGUSR1), ["podman", "kill", "--signal", "SIGUSR1", "c"]),
        (kill_args("docker", "c", signal.SIGKILL), ["docker", "kill", "--signal", "SIGKILL", "c"]),
        (remove_args("podman", "c"), ["podman", "rm", "--force", "--time", "0", "c"]),
        (remove_args("docker", "c"), ["docker", "rm", "--force", "c"]),
        (
            pid_args("docker", "c", "/bin/d"),
            ["/bin/d", "container", "inspect", "--format", "{{.State.Pid}}", "c"],
        ),
    ],
    ids=["stop", "stop-part-second", "stop-now", "usr1", "kill", "rm-podman", "rm-docker", "inspect"],
)
def test_commands_by_name(args: list[str], want: list[str]) -> None:
    assert args == want


# -- limits ---------------------------------------------------------------------------------------

INF = -1  # resource.RLIM_INFINITY


@pytest.mark.parametrize(
    ("nofile", "nproc", "want"),
    [
        ((1024, 20000), (96365, 96365), {"nofile": (1024, 20000), "nproc": (32768, 32768)}),
        ((1024, 524288), (4096, 8192), {"nofile": (1024, 524288), "nproc": (4096, 8192)}),
        ((1024, 4096), (INF, INF), {"nofile": (1024, 4096), "nproc": (32768, 32768)}),
        ((INF, INF), (100, 100), {"nproc": (100, 100)}),
    ],
    ids=["capped-processes", "below-the-cap", "unlimited-processes", "unlimited-files-left-out"],
)
def test_podman_gets_the_agents_own_limits(
    nofile: tuple[int, int], nproc: tuple[int, int], want: dict[str, tuple[int, int]]
) -> None:
    assert podman_ulimits(nofile, nproc) == want


# -- engine errors and the probe ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log", "error"),
    [
        ("", ""),
        ("hello\nworld\n", ""),
        (
            "Error: runc: runc create failed: unable to start container process: error during container "
            "init: error setting rlimits for ready process: error setting rlimit type 7: operation not "
            "permitted: OCI permission denied\n",
            "Error: runc: runc create failed: unable to start container process: error during container "
            "init: error setting rlimits for ready process: error setting rlimit type 7: operation not "
            "permitted: OCI permission denied",
        ),
        (
            "Trying to pull registry.local/x:1...\nError: initializing source docker://registry.local/x:1: "
            "pinging container registry registry.local: connection refused\n",
            "Error: initializing source docker://registry.local/x:1: pinging container registry "
            "registry.local: connection refused",
        ),
        (
            "Unable to find image 'x:1' locally\ndocker: Error response from daemon: pull access denied.\n",
            "docker: Error response from daemon: pull access denied.",
        ),
        ("Unable to find image 'x:1' locally\n1: Pulling from x\nworker says hi\n", ""),
    ],
    ids=["empty", "worker-output", "rlimits", "pull", "docker-pull", "docker-pulling-is-no-error"],
)
def test_engine_errors_are_found_in_the_log(log: str, error: str) -> None:
    assert engine_error(log) == error


def fake_engine(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_probe_takes_docker_when_its_daemon_answers(tmp_path: Path) -> None:
    docker = fake_engine(tmp_path, "docker", "echo 27.1.0")
    podman = fake_engine(tmp_path, "podman", "echo 4.9.0")
    found = await probe("auto", {"docker": docker, "podman": podman}.get)
    assert found == Probe(EngineInfo("docker", docker, "27.1.0"))
    assert found.engine is not None and found.engine.major() == 27


async def test_probe_falls_back_to_podman_and_says_why_docker_could_not(tmp_path: Path) -> None:
    docker = fake_engine(
        tmp_path,
        "docker",
        'echo; echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. '
        'Is the docker daemon running?" >&2; exit 1',
    )
    podman = fake_engine(tmp_path, "podman", "echo 4.3.1")
    assert await probe("auto", {"docker": docker, "podman": podman}.get) == Probe(
        EngineInfo("podman", podman, "4.3.1")
    )
    none = await probe("docker", {"docker": docker}.get)
    assert none == Probe(
        None,
        "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?",
    )


async def test_probe_says_why_no_engine_can_run(tmp_path: Path) -> None:
    podman = fake_engine(
        tmp_path, "podman", 'echo "Error: could not get runtime: no such file" >&2; exit 125'
    )
    assert await probe("auto", {"podman": podman}.get) == Probe(
        None, "docker is not installed; podman: Error: could not get runtime: no such file"
    )
    assert await probe("none", {"podman": podman}.get) == Probe(
        None, "containers are turned off on this node"
    )


async def test_an_engine_that_does_not_answer_in_time_is_not_taken(tmp_path: Path) -> None:
    podman = fake_engine(tmp_path, "podman", "exec sleep 30")
    found = await probe("podman", {"podman": podman}.get, timeout=0.2)
    assert found.engine is None and "did not answer within 0.2s" in found.why


def test_docker_before_25_is_known_by_its_major_version() -> None:
    assert EngineInfo("docker", "/d", "24.0.7").major() < container.DOCKER_CDI_MAJOR
    assert EngineInfo("docker", "/d", "25.0.0").major() == container.DOCKER_CDI_MAJOR
