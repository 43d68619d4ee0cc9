"""``corral sim``: replay a real trace on the simulator, no NATS needed.

- ``--trace alibaba``: the time-less placement protocol of the FGD paper on the openb trace
  (``services/sim/alibaba.py``): the six published policies and corral's, every seed, the
  table of allocation at 130 % beside the published means, and the curves as a PNG.
  ``--variant`` replays a pod list of the artifact's family instead of the default one
  (``services/sim/alibaba_variants.py``; ``all`` for the whole family) and, when corral and FGD
  both run, says by how much corral leads on the mean and on its worst seed.
- ``--trace philly``: weeks of arrivals and departures of Microsoft's Philly trace through
  corral's services, through FIFO and through Tiresias's 2D-LAS (``services/sim/philly.py``):
  waits, JCT, utilisation, fairness, preemptions, per team and overall.

Trace files default to ``$CORRAL_TRACES/<trace>/`` or ``shared/traces/`` beside the repository.
Every mistake a person can make here is one line and exit status 2 (``BadInput``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from corral.services.cli import progress
from corral.services.cli.jobfile import BadInput

ALIBABA_DIR = "alibaba-gpu-2023"
ALIBABA_NODES = "openb_node_list_gpu_node.csv"
ALIBABA_PODS = "openb_pod_list_default.csv"
ALIBABA_PUBLISHED = "published_alloc_ratio_default.csv"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def find_alibaba(name: str, explicit: str | None = None) -> Path:
    """A file of the Alibaba trace: the given path, $CORRAL_TRACES/alibaba-gpu-2023/<name>, or
    shared/traces/alibaba-gpu-2023/ beside the repository (or beside the working directory)."""
    if explicit:
        if not Path(explicit).is_file():
            raise BadInput(f"{explicit}: no such file")
        return Path(explicit)
    env = os.environ.get("CORRAL_TRACES")
    for candidate in (
        Path(env) / ALIBABA_DIR / name if env else None,
        SHARED / ALIBABA_DIR / name,
        Path.cwd().parent / "shared" / "traces" / ALIBABA_DIR / name,
    ):
        if candidate is not None and candidate.exists():
            return candidate
    raise BadInput(f"{name} not found: pass its path or set CORRAL_TRACES")


def add_parser(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "sim",
        parents=[common_parent],
        help="replay a trace on the simulator: alibaba (placement) or philly (weeks of arrivals)",
    )
    p.add_argument("--trace", choices=["alibaba", "philly"], required=True)
    p.add_argument("--nodes", help="alibaba: the node list CSV; philly: how many 8-GPU nodes (default 64)")
    p.add_argument("--pods", help="alibaba: the pod list CSV")
    p.add_argument("--published", help="alibaba: the published summary CSV (default: the trace's)")
    p.add_argument(
        "--variant",
        help="alibaba: the pod list derived from the default one: default, multigpu20..50, gpushare20..100, "
        "gpuspec05..33, cpu0..cpu300, a comma-separated list, or all (default: default)",
    )
    p.add_argument("--seeds", default="42-51", help="alibaba: seeds, e.g. 42-51 or 42,45")
    p.add_argument(
        "--policies",
        help="comma-separated; alibaba: Random,DotProd,GpuClustering,GpuPacking,BestFit,FGD,corral; "
        "philly: corral,fifo,tiresias (default: all)",
    )
    p.add_argument("--file", help="philly: the trace CSV (default: philly/philly.csv)")
    p.add_argument("--jobs", type=int, help="philly: jobs in the slice (default 20000)")
    p.add_argument("--start", help="philly: the slice starts at this UTC date (default 2017-10-23)")
    p.add_argument("--checkpointable", type=float, help="philly: share of jobs that checkpoint (0..1)")
    p.add_argument(
        "--pool",
        type=float,
        help="philly: share of each team's entitlement corral holds in the cohort for all to borrow "
        "(0..1, default 0.5)",
    )
    p.add_argument(
        "--borrow-limit",
        type=float,
        help="philly: each team's queue borrows at most this many times its entitlement (default: no limit)",
    )
    p.add_argument(
        "--cycle",
        type=float,
        help="philly: seconds between decisions of the services (default 60; 0: every event)",
    )
    p.add_argument("--plot", help="write the figure to this PNG file")
    p.set_defaults(fn=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> None:
    if args.plot and not Path(args.plot).absolute().parent.is_dir():
        # Refused now, not after minutes of simulation, when the figure would have nowhere to go.
        raise BadInput(f"--plot {args.plot}: no directory {Path(args.plot).absolute().parent}")
    if args.trace == "alibaba":
        _alibaba(args)
    else:
        _philly(args)


def _policies(text: str | None, known: Sequence[str]) -> list[str]:
    return _chosen("policy", text, known, ", ".join(known)) if text else list(known)


def _chosen(what: str, text: str, known: Sequence[str], shown: str) -> list[str]:
    """The names of a comma-separated ``text``, each one of ``known``; refused, saying ``shown``
    are known, otherwise."""
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in known]
    if unknown or not wanted:
        raise BadInput(f"unknown {what} {', '.join(unknown) or '(none)'}; known: {shown}")
    return wanted


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(text)


# -- alibaba -----------------------------------------------------------------------------------------


def _replay(job: tuple[str, str, str, str, int]) -> Any:
    from corral.services.sim import alibaba, alibaba_variants

    nodes_csv, pods_csv, variant, policy, seed = job
    nodes = alibaba.load_nodes(nodes_csv)
    pods = alibaba_variants.build(variant, alibaba.load_pods(pods_csv), nodes)
    return alibaba.replay(nodes, pods, policy, seed)


def _variants(text: str) -> list[str]:
    from corral.services.sim.alibaba_variants import FAMILY

    return list(FAMILY) if text == "all" else _chosen("variant", text, FAMILY, "all, " + ", ".join(FAMILY))


def _alibaba(args: argparse.Namespace) -> None:
    from corral.services.sim import alibaba, alibaba_variants
    from corral.services.sim.alibaba_variants import DEFAULT

    for flag in ("file", "jobs", "start", "checkpointable", "pool", "borrow_limit", "cycle"):
        if getattr(args, flag) is not None:
            raise BadInput(f"--{flag.replace('_', '-')} is for --trace philly")
    # The files the operator named are checked before any default is looked for.
    for named in (args.nodes, args.pods, args.published):
        if named and not Path(named).is_file():
            raise BadInput(f"{named}: no such file")
    nodes_csv = find_alibaba(ALIBABA_NODES, args.nodes)
    pods_csv = find_alibaba(ALIBABA_PODS, args.pods)
    try:
        seeds = alibaba.parse_seeds(args.seeds)
    except ValueError:
        raise BadInput(f"--seeds {args.seeds!r}: use e.g. 42-51 or 42,43,50") from None
    if not seeds:
        raise BadInput("--seeds: give at least one seed")
    policies = _policies(args.policies, alibaba.POLICIES)
    variants = _variants(DEFAULT if args.variant is None else args.variant)
    try:
        nodes = alibaba.load_nodes(nodes_csv)
        pods = alibaba.load_pods(pods_csv)
    except (KeyError, ValueError) as e:
        raise BadInput(f"not a node and pod list in the published format: {e}") from None
    for variant in variants:
        try:
            alibaba_variants.build(variant, pods, nodes)
        except ValueError as e:
            raise BadInput(f"--variant {variant}: {e}") from None
    published = None
    pub_path = Path(args.published) if args.published else nodes_csv.parent / ALIBABA_PUBLISHED
    if pub_path.is_file():
        published = alibaba.load_published(pub_path)
    jobs = [(str(nodes_csv), str(pods_csv), v, p, s) for v in variants for p in policies for s in seeds]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with progress.shown("replaying", len(jobs), "runs") as done:
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(_replay, j) for j in jobs]
                for _ in as_completed(futures):
                    done(1)
                curves = [f.result() for f in futures]
        else:
            curves = []
            for j in jobs:
                curves.append(_replay(j))
                done(1)
    per_run = len(policies) * len(seeds)
    runs: dict[str, Any] = {}
    texts: list[str] = []
    for i, variant in enumerate(variants):
        results = alibaba.Results(curves[i * per_run : (i + 1) * per_run])
        # The published figures are the default list's; beside a variant they would mislead.
        pub = published if variant == DEFAULT else None
        run: dict[str, Any] = {"variant": variant, "policies": results.to_json()}
        text = f"variant: {variant}\n" + alibaba.table(results, pub)
        if pub:
            run["published"] = pub
        if alibaba.CORRAL in policies and "FGD" in policies:
            run["corral_vs_FGD"] = alibaba.versus(results)
        if args.plot:
            path = Path(args.plot)
            if len(variants) > 1:
                path = path.with_name(f"{path.stem}-{variant}{path.suffix}")
            png = alibaba.plot(results, path, title=f"GPU allocation vs arrived demand ({variant})")
            run["plot"] = str(png)
            text += f"\nplot: {png}"
        runs[variant] = run
        texts.append(text)
    data: dict[str, Any] = runs[variants[0]] if len(variants) == 1 else {"variants": runs}
    if all("corral_vs_FGD" in r for r in runs.values()):
        texts.append(_versus_table(runs))
    _print(args, data, "\n\n".join(texts))


def _versus_table(runs: dict[str, Any]) -> str:
    """corral against FGD on every variant: both means at 130 % and the worst seed's margin."""
    head = f"{'variant':<14}{'corral':>9}{'FGD':>9}{'mean +/-':>10}{'worst seed':>12}{'ahead':>8}"
    lines = [head, "-" * len(head)]
    for name, run in runs.items():
        v = run["corral_vs_FGD"]
        lines.append(
            f"{name:<14}{v['corral']:>9.2f}{v['FGD']:>9.2f}{v['mean_margin']:>+10.2f}"
            f"{v['worst_margin']:>+12.2f}{v['seeds_ahead']:>5}/{v['seeds']}"
        )
    return "\n".join(lines)


# -- philly ------------------------------------------------------------------------------------------


def _philly(args: argparse.Namespace) -> None:
    from corral.services.sim import philly as experiment
    from corral.services.sim.traces import philly as trace

    for flag in ("pods", "published", "variant"):
        if getattr(args, flag) is not None:
            raise BadInput(f"--{flag} is for --trace alibaba")
    try:
        nodes = int(args.nodes) if args.nodes is not None else experiment.NODES
    except ValueError:
        raise BadInput(f"--nodes {args.nodes!r}: with --trace philly, give a number of 8-GPU nodes") from None
    jobs = args.jobs if args.jobs is not None else experiment.JOBS
    share = args.checkpointable if args.checkpointable is not None else experiment.CHECKPOINTABLE
    if nodes < 1 or jobs < 1:
        raise BadInput("--nodes and --jobs must be at least 1")
    if not 0.0 <= share <= 1.0:
        raise BadInput(f"--checkpointable {share}: a share between 0 and 1")
    pool = args.pool if args.pool is not None else experiment.POOL
    if not 0.0 <= pool <= 1.0:
        raise BadInput(f"--pool {pool}: a share between 0 and 1")
    borrow = args.borrow_limit if args.borrow_limit is not None else experiment.BORROW
    if borrow is not None and not (borrow >= 0.0 and math.isfinite(borrow)):
        raise BadInput(f"--borrow-limit {borrow}: times the entitlement, 0 or more")
    cycle = args.cycle if args.cycle is not None else experiment.CYCLE_S
    if cycle < 0:
        raise BadInput(f"--cycle {cycle}: seconds, 0 or more")
    policies = _policies(args.policies, experiment.POLICIES)
    try:
        path = trace.find(args.file)
    except FileNotFoundError as e:
        raise BadInput(str(e)) from None
    try:
        sliced = experiment.load_slice(path, args.start or experiment.START, jobs)
    except (KeyError, ValueError) as e:
        raise BadInput(f"{path}: {e}") from None
    if not sliced:
        raise BadInput(f"no job of {path} arrives from {args.start or experiment.START} on")
    exp = experiment.Experiment(
        tuple(sliced), nodes, checkpointable=share, cycle_s=cycle, pool=pool, borrow=borrow
    )
    try:
        exp.quotas  # noqa: B018 - checks that every team gets a GPU
    except ValueError as e:
        raise BadInput(f"--nodes {nodes}: {e}") from None
    with progress.shown("simulating", len(sliced) * len(policies), "jobs", scale=True) as done:
        outcomes = experiment.run(exp, policies, progress=done if progress.on_terminal() else None)
    data = experiment.to_json(exp, outcomes)
    text = experiment.table(exp, outcomes)
    if args.plot:
        png = experiment.plot(outcomes, args.plot)
        data["plot"] = str(png)
        text += f"\nplot: {png}"
    _print(args, data, text)
