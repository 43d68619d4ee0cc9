"""Metrics of a live corral, read back as Prometheus and an OTLP collector get them.

Real nats-server, every service, two simulated 8-GPU nodes with agents running real processes:
a job whose worker fails and is restarted once, two 8-GPU batch jobs filling the cluster, then
an urgent one that preempts one of them, which waits in its queue again. Then the figures on the
Prometheus endpoint (an HTTP GET) and in the newest OTLP export must be what the log says.
"""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from pathlib import Path

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from corral.events.queues import PriorityClassSpec
from corral.projections.state import WHOLE, State
from corral.services.runtime import metrics
from tests.integration import polling
from tests.integration.otlp_metrics import MetricsReceiver, Points
from tests.integration.test_cluster_failures import WAIT, job_spec, live, phase

CLASSES = (PriorityClassSpec("batch", 10), PriorityClassSpec("urgent", 1000, preemptible=False))
SLEEP = ("sleep", "600")
ROLES = ("admission", "placer", "preemptor", "health", "assignments")

Series = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Series:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(series: Series | Points, name: str, **labels: str) -> float:
    return sum(v for attrs, v in series.get(name, ()) if all(attrs.get(k) == x for k, x in labels.items()))


def held_gpus(s: State) -> float:
    """GPUs the jobs hold, from the log's own fold."""
    milli = sum(c.milli for j in s.jobs.values() if j.held for w in j.held.workers for c in w.gpus)
    return milli / WHOLE


async def test_metrics_after_restarts_and_a_preemption(tmp_path: Path) -> None:
    with MetricsReceiver() as receiver:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        telemetry = metrics.Telemetry(otlp=True, otlp_every=0.3, exporter=OTLPMetricExporter(receiver.url))
        await telemetry.start(0, "127.0.0.1")
        metrics.install(telemetry)
        try:
            async with live(tmp_path, nodes=2, classes=CLASSES) as it:
                crash = (sys.executable, "-c", "import sys; sys.exit(3)")
                await it.submit("bad", msgspec.structs.replace(job_spec(crash), max_restarts=1))
                await it.until(lambda s: phase(s, "bad") == "failed")
                for name in ("low", "filler"):
                    await it.submit(name, job_spec(SLEEP, gpus=8, priority_class="batch"))
                await it.until(lambda s: phase(s, "low") == phase(s, "filler") == "running")
                await it.submit("urgent", job_spec(SLEEP, gpus=8, priority_class="urgent"))
                s = await it.until(
                    lambda s: (
                        phase(s, "urgent") == "running"
                        and sorted([phase(s, "low"), phase(s, "filler")]) == ["queued", "running"]
                    )
                )
                reader = it.cluster.query
                assert reader is not None
                await polling.until(lambda: reader.state.seq >= s.seq, WAIT)

                got = await asyncio.to_thread(scrape, telemetry.port)
                assert total(got, "corral_queue_jobs_pending", corral_queue="team-a") == 1
                assert total(got, "corral_queue_jobs_admitted", corral_queue="team-a") == 2
                assert total(got, "corral_node_gpus_allocated") == held_gpus(s) == 16
                assert total(got, "corral_node_gpus_free") == 0
                assert total(got, "corral_node_gpus_unhealthy") == 0
                assert total(got, "corral_queue_quota_used", corral_queue="team-a") == 16
                assert total(got, "corral_queue_quota_nominal", corral_queue="team-a") == 16
                assert total(got, "corral_queue_quota_borrowed", corral_queue="team-a") == 0
                preempted = total(
                    got,
                    "corral_job_preemptions_total",
                    corral_preemption_reason="within-queue",
                    corral_preemption_kind="stop",
                )
                assert preempted == 1
                assert total(got, "corral_job_preemption_lost_gpu_time_hours_total") > 0
                assert total(got, "corral_job_restarts_total", corral_queue="team-a") == 1
                # Placed: bad twice, low, filler, urgent; admitted as often.
                assert total(got, "corral_job_placement_duration_seconds_count") == 5
                assert total(got, "corral_job_admission_duration_seconds_count") == 5
                for role in ROLES:
                    assert total(got, "corral_lease_held", corral_role=role) == 1, role
                    assert [v for a, v in got["corral_service_lag"] if a["corral_role"] == role], role
                assert total(got, "corral_service_cycle_duration_seconds_count", corral_role="placer") > 0
                # at least one cycle's: five placements may come in fewer cycles, as they are batched
                assert total(got, "corral_service_cycle_decisions_sum", corral_role="placer") >= 1

                # The collector gets the same figures, over OTLP: an export of the state scraped
                # above (an earlier one may be from before urgent was placed, low still holding).
                sent = await receiver.until(
                    lambda p: (
                        total(p, "corral.job.preemptions") >= 1
                        and total(p, "corral.job.placement.duration") == 5
                        and total(p, "corral.node.gpus.allocated") == 16
                    ),
                    WAIT,
                )
                assert total(sent, "corral.queue.jobs.pending", **{"corral.queue": "team-a"}) == 1
                assert total(sent, "corral.job.restarts") == 1
                assert set(metrics.METRICS) <= set(sent)
        finally:
            metrics.install(None)
            await telemetry.stop()
