"""Runs a worker whose job names an ``image`` in a container, with podman or docker, under the
same contract as a plain worker.

The functions that build command lines are pure: a ``StartWorker`` (with the engine, the CDI
devices of its GPUs and the limits to give it) becomes one ``run`` argument list; a container
name becomes ``stop``/``kill``/``rm``/``inspect`` argument lists. ``probe`` is the only one that
runs anything: it asks each engine whether it answers here.

Invariants of a worker's container:

- Its name is ``container_name(job, attempt, rank, agent=…)``: the same on every call, different
  between attempts and ranks, so the agent reaches it by name to signal or stop it, and a
  restarted agent can remove a container its predecessor lost. Job ids are unique within one
  corral only, and an engine's names are one namespace for the whole host: the name (and the
  ``corral.agent`` label) also carries the id of the agent's work directory (``agent_id``), so
  agents of two corrals on one host, each on its own work directory, never reach each other's
  containers, and an agent restarted on the same work directory reaches its predecessor's.
- It sees what a plain worker sees: the contract's environment (``-e`` for each variable), the
  host's network (``MASTER_ADDR``/``MASTER_PORT`` reach other nodes as they do from the host) and
  IPC (NCCL's shared-memory transport between ranks on one node, PyTorch's data loaders), its
  working and checkpoint directories at their host paths (read-write: the paths in
  ``$CORRAL_CHECKPOINT_DIR``, ``$CORRAL_RESUME_FROM`` and reported checkpoint locations mean the
  same inside and out), each data mount at its target (read-only when asked), and the GPUs it was
  placed on and no other.
- An init process (``--init``) is its pid 1, so that a signal sent by name (``kill --signal``)
  reaches the worker, and the worker's own exit status is the container's: 128+N when signal N
  killed it. The engine's own failures exit 125 (the engine), 126 (the command cannot run) or
  127 (no such command), with the engine's message on stderr.
- It is removed when it exits (``--rm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import shutil
import signal
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from corral.events import jobs
from corral.events.jobs import Mount
from corral.projections.assignments import GpuBinding
from corral.services.agent.decide import StartWorker

Engine = Literal["podman", "docker"]
ContainerMode = Literal["auto", "podman", "docker", "none"]
Ulimits = Mapping[str, tuple[int, int]]

# Container Device Interface names of NVIDIA GPUs, as the NVIDIA Container Toolkit writes them
# (``nvidia-ctk cdi generate``; its default name strategies are "index" and "uuid"):
# ``nvidia.com/gpu=<index>`` for a whole GPU, ``nvidia.com/gpu=<gpu index>:<MIG device index>``
# for a MIG device, ``nvidia.com/gpu=<GPU-… or MIG-… UUID>`` for either, ``nvidia.com/gpu=all``.
# https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html and
# NVIDIA/nvidia-container-toolkit pkg/nvcdi/namer.go ("generates devices names such as 0 or 1:0").
# The toolkit's automatic refresh does not follow MIG reconfiguration: after creating a MIG
# instance, ``nvidia-ctk cdi generate`` must run again for its device to have a name.
CDI_GPU = "nvidia.com/gpu"
ENGINE_FAILURES = frozenset({125, 126, 127})
DOCKER_CDI_MAJOR = 25  # docker passes CDI devices to --device from 25 on
PODMAN_NPROC_CAP = 32768
_ENGINES: tuple[Engine, ...] = ("docker", "podman")  # a running docker daemon is a deliberate setup
AGENT_ID_FILE = "agent.id"  # in the agent's work directory
_AGENT_ID = re.compile(r"[0-9a-f]{12}")
_ENGINE_ERROR = re.compile(r"^(Error: |Error response from daemon: |docker: )")


class EngineInfo(NamedTuple):
    name: Engine
    path: str
    version: str

    def major(self) -> int:
        m = re.match(r"(\d+)", self.version)
        return int(m.group(1)) if m else 0


class Probe(NamedTuple):
    """The engine that runs containers here, or ``None`` and why none can."""

    engine: EngineInfo | None
    why: str = ""


# -- names, devices, mounts ----------------------------------------------------------------------


def container_name(job_id: str, attempt: int, rank: int, *, agent: str) -> str:
    """``corral-<agent>-<job>-a<attempt>-r<rank>``, ``agent`` the id of the agent's work directory
    (``agent_id``). A job id with characters a container name cannot hold (or a very long one) is
    cut to what it can, with a checksum of the whole id, so that two jobs never share a name."""
    job = re.sub(r"[^a-zA-Z0-9_.-]", "-", job_id)[:80]
    if job != job_id:
        job = f"{job}-{zlib.crc32(job_id.encode()):08x}"
    return f"corral-{agent}-{job}-a{attempt}-r{rank}"


def cdi_device(gpu: int | str, mig: int | None = None) -> str:
    """The CDI name of GPU ``gpu`` (an index or a UUID), or of MIG device ``mig`` on it."""
    return f"{CDI_GPU}={gpu}" if mig is None else f"{CDI_GPU}={gpu}:{mig}"


def gpu_devices(gpus: Sequence[GpuBinding], mig: Mapping[tuple[str, int], str]) -> list[str]:
    """The CDI devices of a worker's GPUs, once each (two shares of one GPU are one device).
    ``mig`` names the MIG instances that exist: (GPU UUID, start slice) -> the instance's CDI
    name on that GPU (its UUID, or ``<gpu>:<mig index>``). Raises ``LookupError`` for a MIG slot
    with no instance: a container must not get the whole GPU instead."""
    out: list[str] = []
    for g in gpus:
        if g.mig is None:
            name = cdi_device(g.index)
        else:
            instance = mig.get((g.uuid, g.mig.start))
            if instance is None:
                raise LookupError(
                    f"MIG instance {g.mig.profile} at slice {g.mig.start} of GPU {g.index} does not exist"
                )
            name = f"{CDI_GPU}={instance}"
        if name not in out:
            out.append(name)
    return out


def mount_problem(m: Mount) -> str:
    """Why ``m`` cannot be given to a container with ``-v``, or ``""``."""
    return jobs.mount_problem(m, container=True)


# -- the environment and the limits ---------------------------------------------------------------


def container_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a container worker gets: the contract's variables, unbuffered Python output (logs
    readable while it runs), and no host ``PATH`` (the image has its own). The NVIDIA runtime's
    legacy hook exposes every GPU named by ``NVIDIA_VISIBLE_DEVICES``, which CUDA images set to
    ``all``; ``void`` turns that off, so a worker gets only the CDI devices of its own GPUs
    (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/1.16.0/docker-specialized.html)."""
    return {"PYTHONUNBUFFERED": "1", **env, "NVIDIA_VISIBLE_DEVICES": "void"}


def podman_ulimits(nofile: tuple[int, int], nproc: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """The limits a podman container is given: the agent's own, as a plain worker inherits them.

    Left alone, rootful podman asks the OCI runtime for 1048576 open files and processes, and
    raising a hard limit needs CAP_SYS_RESOURCE: where the agent lacks it, every start fails
    with ``error setting rlimits for ready process: error setting rlimit type 7: operation not
    permitted``. Podman 4.3 also lowers its own process limit to 32768 before it starts the
    container (``setrlimit(RLIMIT_NPROC, 32768)``), so no more can be asked for."""

    def finite(limit: tuple[int, int], cap: int | None = None) -> tuple[int, int] | None:
        soft, hard = limit
        if cap is not None:
            soft = cap if soft < 0 else min(soft, cap)
            hard = cap if hard < 0 else min(hard, cap)
        return None if soft < 0 or hard < 0 else (min(soft, hard), hard)

    out = {"nofile": finite(nofile), "nproc": finite(nproc, PODMAN_NPROC_CAP)}
    return {k: v for k, v in out.items() if v is not None}


# -- command lines -------------------------------------------------------------------------------


def run_args(
    engine: Engine,
    spec: StartWorker,
    *,
    agent: str,
    workdir: str,
    env: Mapping[str, str],
    devices: Sequence[str] = (),
    ulimits: Ulimits | None = None,
    exe: str | None = None,
    user: tuple[int, int] | None = None,
) -> list[str]:
    """``<engine> run …`` for one worker of the agent whose work directory's id is ``agent``
    (``agent_id``): ``env`` is its whole environment (``container_env``), ``devices`` the CDI
    names of its GPUs (``gpu_devices``). The image's entrypoint, if it has one, runs the job's
    command; a job without a command runs the image's own. With ``user`` (uid, gid; a corral
    whose tenants share nodes), the worker runs as that host user whatever the image says, with
    no capability and no way to gain privileges, as a sandboxed worker does."""
    name = container_name(spec.job_id, spec.attempt, spec.rank, agent=agent)
    args = [exe or engine, "run", "--rm", "--name", name]
    if user is not None:
        args += ["--user", f"{user[0]}:{user[1]}", "--cap-drop", "ALL"]
        args += ["--security-opt", "no-new-privileges"]
    else:
        # The image's root keeps the engine's default capabilities, less making device nodes:
        # one made in a directory the agent reads (its checkpoint directory) is no worker's file.
        args += ["--cap-drop", "MKNOD"]
    args += ["--label", f"corral.agent={agent}", "--label", f"corral.job={spec.job_id}"]
    args += ["--label", f"corral.attempt={spec.attempt}", "--label", f"corral.rank={spec.rank}"]
    args += ["--network", "host", "--ipc", "host", "--init"]
    args += ["--stop-timeout", str(max(0, math.ceil(spec.grace_seconds)))]
    # A plain worker has no limit on its processes; podman would give a container 2048.
    args += ["--pids-limit=-1"]
    if engine == "podman":
        # The worker's output reaches the agent's log through the attached client; podman's own
        # log (a file in its storage, or the journal) would only hold a second copy.
        args += ["--log-driver", "none"]
    for kind, (soft, hard) in sorted((ulimits or {}).items()):
        args += ["--ulimit", f"{kind}={soft}:{hard}"]
    for d in devices:
        args += ["--device", d]
    for key in sorted(env):
        args += ["-e", f"{key}={env[key]}"]
    for host, inside, read_only in _volumes(spec, workdir):
        args += ["-v", f"{host}:{inside}:ro" if read_only else f"{host}:{inside}"]
    args += ["-w", workdir, spec.image or "", *spec.command]
    return args


def _volumes(spec: StartWorker, workdir: str) -> list[tuple[str, str, bool]]:
    # The job's checkpoint directory holds every attempt's and rank's, this worker's
    # $CORRAL_CHECKPOINT_DIR (with the REQUEST and DONE control files) among them.
    own = [(workdir, workdir, False), (spec.job_checkpoint_dir, spec.job_checkpoint_dir, False)]
    return own + [(m.source, m.target, m.read_only) for m in spec.mounts]


def stop_args(engine: Engine, name: str, grace: float, exe: str | None = None) -> list[str]:
    """SIGTERM (or the image's stop signal) to the worker, SIGKILL after ``grace`` seconds."""
    return [exe or engine, "stop", "-t", str(max(0, math.ceil(grace))), name]


def kill_args(engine: Engine, name: str, sig: signal.Signals, exe: str | None = None) -> list[str]:
    return [exe or engine, "kill", "--signal", sig.name, name]


def remove_args(engine: Engine, name: str, exe: str | None = None) -> list[str]:
    """Kill and remove a container, running or not."""
    if engine == "podman":
        return [exe or engine, "rm", "--force", "--time", "0", name]
    return [exe or engine, "rm", "--force", name]


def pid_args(engine: Engine, name: str, exe: str | None = None) -> list[str]:
    """Prints the host pid of the container's init (0 while it is not running)."""
    return [exe or engine, "container", "inspect", "--format", "{{.State.Pid}}", name]


def probe_args(engine: Engine, exe: str | None = None) -> list[str]:
    """Answers with the engine's version only where it can work: docker's daemon is reachable,
    podman's storage and runtime are set up."""
    if engine == "podman":
        return [exe or engine, "info", "--format", "{{.Version.Version}}"]
    return [exe or engine, "info", "--format", "{{.ServerVersion}}"]


def engine_error(output: str) -> str:
    """The engine's own complaint among the last lines of a worker's log, or ``""``."""
    lines = output.strip().splitlines()[-20:]
    return next((line.strip() for line in reversed(lines) if _ENGINE_ERROR.match(line.strip())), "")


# -- whose containers ------------------------------------------------------------------------------


def agent_id(work_dir: Path) -> str:
    """The id of the agent's work directory: made once, at random, and kept there
    (``AGENT_ID_FILE``), so that it outlives the agent as its workers do. It is what a
    container's name is scoped by (``container_name``). Not the corral's stream: an agent may
    not read the log. Not the directory's path: agents in containers of their own may each have
    another directory at one path, and share the host's engine. Two corrals never share a work
    directory (their keepers' records would be one), and an agent restarted on its directory
    takes back its predecessor's workers, containers with them. Raises ``OSError`` where the id
    cannot be read or kept."""
    path = work_dir / AGENT_ID_FILE
    with contextlib.suppress(FileNotFoundError):
        # Damaged (a disk's garbage, not text at all) is read as any other damage: made again.
        kept = path.read_text(errors="replace").strip()
        if _AGENT_ID.fullmatch(kept):
            return kept
    work_dir.mkdir(parents=True, exist_ok=True)
    # Two agents on one directory (in containers, perhaps, of one pid) never share a temporary
    # file; linked, not moved, into place, an id is made once: an agent that made one at the
    # same moment reads the one that was kept, not its own that another replaced.
    made = work_dir / f".{AGENT_ID_FILE}.{secrets.token_hex(8)}"
    made.write_text(secrets.token_hex(6) + "\n")
    try:
        try:
            os.link(made, path)
        except FileExistsError:
            kept = path.read_text(errors="replace").strip()
            if _AGENT_ID.fullmatch(kept):
                return kept
            os.replace(made, path)  # damaged: made again
        except OSError:  # a file system without hard links
            os.replace(made, path)
    finally:
        made.unlink(missing_ok=True)
    return path.read_text(errors="replace").strip()


# -- which engine runs here ----------------------------------------------------------------------


async def probe(
    mode: ContainerMode = "auto", which: Callable[[str], str | None] = shutil.which, timeout: float = 20.0
) -> Probe:
    """The first engine (``mode``, or docker then podman) that answers here."""
    if mode == "none":
        return Probe(None, "containers are turned off on this node")
    reasons: list[str] = []
    for engine in _ENGINES if mode == "auto" else (mode,):
        path = which(engine)
        if path is None:
            reasons.append(f"{engine} is not installed")
            continue
        code, out = await run_quietly(probe_args(engine, path), timeout)
        version = out.strip().splitlines()[-1].strip() if out.strip() else ""
        if code == 0 and version:
            return Probe(EngineInfo(engine, path, version))
        reasons.append(f"{engine}: {_last_line(out) or f'exit {code}'}")
    return Probe(None, "; ".join(reasons))


async def run_quietly(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Run an engine command; its exit status and its output (stdout and stderr together).
    A command that cannot start or does not finish in time reads as failed, with why."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e.strerror or e}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"{' '.join(argv[:2])} did not answer within {timeout:g}s"
    except asyncio.CancelledError:  # a start given up: leave no engine command behind
        if proc.returncode is None:
            proc.kill()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
