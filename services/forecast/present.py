"""A what-if answer as a person reads it: what ``corral whatif`` prints. Plain data in, text
out; nothing here imports the simulator, so the client can use it."""

from __future__ import annotations

from typing import Any

SOON_S = 300.0  # a start later than this is worth suggesting changes for


def text(told: dict[str, Any]) -> str:
    """An answer as a person reads it."""
    if not told["accepted"]:
        return f"not accepted: {told['reason']}"
    lines = ["accepted"]
    stops = told.get("preempts", [])
    if told["starts_now"]:
        lines.append("admitted and placed now:")
        for p in told["placed"]:
            where = ", ".join(str(g) for g in p["gpus"]) or "none"
            islands = ", ".join(map(str, p["islands"])) or "-"
            lines.append(f"  rank {p['rank']}: {p['node']} GPUs {where} (NVLink island {islands})")
        if stops:
            lines.append(f"it would preempt {len(stops)}: {stopped(stops)}")
        return "\n".join(lines)
    if stops:
        lines.append(f"it would preempt {len(stops)}: {stopped(stops)} (and start once they stop)")
    if told["why_waiting"]:
        lines.append(f"waits now: {told['why_waiting']}")
    if told["start"] is None and told.get("cut_s") is not None:
        lines.append(f"estimated start: not found in the {told['cut_s']:.0f} s a what-if may simulate")
    elif told["start"] is None:
        lines.append(f"estimated start: not within {told['horizon_s'] / 86400:.0f} days")
    elif stops and told.get("early") is not None and told["early"] < told["start"]:
        # by the deadline its stops are given; sooner only if they leave sooner
        soonest = span(max(0.0, told["early"] - told["now"]))
        lines.append(
            f"estimated start: in {span(told['start'] - told['now'])}, when the jobs it stops must "
            f"have left (in {soonest} if they leave as soon as they can)"
        )
    else:
        lines.append(f"estimated start: in {span(told['start'] - told['now'])}")
    lines.append(f"({told['assumption']})")
    if told["start"] is None or told["start"] > told["now"] + SOON_S:
        found = told["start_now_with"]
        if found:
            lines.append("it would start now with:")
            lines += [f"  {what}" for what in found]
        else:
            lines.append("no smaller ask tried starts it now")
    return "\n".join(lines)


def stopped(stops: list[str]) -> str:
    """Whom it would stop, each alike counted once: another tenant's jobs are all "a job of
    queue X", and four of them read "a job of queue X, a job of queue X, ..." where "4 jobs of
    queue X" says it."""
    counted: dict[str, int] = {}
    for who in stops:
        counted[who] = counted.get(who, 0) + 1
    return ", ".join(_times(who, n) for who, n in counted.items())


def _times(who: str, n: int) -> str:
    if n == 1:
        return who
    if who.startswith("a job of "):
        return f"{n} jobs of {who.removeprefix('a job of ')}"
    return f"{n} × {who}"


def span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
