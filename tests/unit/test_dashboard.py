"""The Grafana dashboard queries only metrics corral exports, by the names Prometheus shows.

The names come from the one table of metrics (``metrics.METRICS``) through ``prometheus_names``,
which is itself checked against what OpenTelemetry's Prometheus reader really renders for every
metric of the table, so the dashboard cannot drift from the code unnoticed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import yaml

from corral.projections.state import State
from corral.services.runtime import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "corral.json"


def exported() -> set[str]:
    return {n for name in metrics.METRICS for n in metrics.prometheus_names(name)}


def queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", ())]:
            out += [t["expr"] for t in sub.get("targets", ())]
    return out


class _Lease:
    held = True


class _Log:
    def tail(self) -> int:
        return 12


class _Service:
    role, producer, lease, log = "placer", "placer@host:1", _Lease(), _Log()
    state = State(seq=10)


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = queries(dashboard)
    assert len(exprs) >= 15
    used = {name for e in exprs for name in re.findall(r"\bcorral_[a-z_]+", e)}
    labels = {"corral_queue", "corral_gpu_model", "corral_node_pool", "corral_role", "corral_replica"}
    labels |= {"corral_preemption_reason", "corral_preemption_kind"}
    unknown = used - exported() - labels
    assert not unknown, f"the dashboard queries metrics corral does not export: {sorted(unknown)}"
    # Every family of metrics has a panel: queues, quota, GPUs, waits, preemptions, services.
    for family in ("queue_jobs", "queue_quota", "node_gpus", "placement", "preemption", "service_lag"):
        assert any(family in name for name in used), family


def test_prometheus_names_are_what_the_endpoint_shows() -> None:
    telemetry = metrics.Telemetry(otlp=False)
    one = {"corral.queue": "q", "corral.gpu.model": "H100", "corral.node.pool": "p"}
    gauges = [n for n, m in metrics.METRICS.items() if m.kind == "gauge"]
    telemetry.watch_cluster(lambda: State(seq=3), lambda _: {n: [(1.0, one)] for n in gauges})
    telemetry.watch_service(_Service())
    for name, m in metrics.METRICS.items():
        if m.kind == "counter":
            telemetry.add(name, 1, one)
        elif m.kind == "histogram":
            telemetry.record(name, 1, one)
    text = telemetry.prometheus_text().decode()
    shown = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("corral_")}
    assert shown == exported()
    assert 'corral_service_lag{corral_role="placer"} 2.0' in text
    assert 'corral_lease_held{corral_replica="placer@host:1",corral_role="placer"} 1.0' in text


def test_grafana_and_prometheus_are_provisioned_in_compose() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for service in ("prometheus", "grafana"):
        for volume in compose[service]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    uids = {d["uid"] for d in datasource["datasources"]}
    dashboard = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p} == uids
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert [job["job_name"] for job in scrape["scrape_configs"]] == ["corral"]


def test_two_read_replicas_export_the_same_cluster_figures_and_the_dashboard_takes_their_max() -> None:
    """Two read service replicas fold the same log: each exports the cluster's figures alike, so
    a ``sum`` over replicas would show twice the GPUs; every query of a cluster figure takes the
    ``max`` over replicas (``max without (instance)``: one scrape target per process), and over
    replicas only, before it adds anything up. A ``max by`` that dropped the queue, the GPU model
    or the reason would show the largest queue's preemptions, or one model's quota, as the total."""
    state = State(seq=7)
    one = {"corral.queue": "q", "corral.gpu.model": "H100", "corral.node.pool": "p"}
    shown = []
    for _ in range(2):
        replica = metrics.Telemetry(otlp=False)
        replica.watch_cluster(lambda: state, lambda s: {"corral.node.gpus.free": [(float(s.seq), one)]})
        text = replica.prometheus_text().decode()
        shown.append([line for line in text.splitlines() if line.startswith("corral_node_gpus_free{")])
    assert shown[0] == shown[1] and len(shown[0]) == 1
    cluster = {n for name in metrics.CLUSTER for n in metrics.prometheus_names(name)}
    assert {n for name in metrics.METRICS for n in metrics.prometheus_names(name)} - cluster  # services'
    for expr in queries(json.loads(DASHBOARD.read_text())):
        names = set(re.findall(r"\bcorral_[a-z_]+", expr)) & cluster
        for name in names:
            taken = re.findall(rf"(\w+(?: (?:by|without) \([^)]*\))?) \((?:rate\(|increase\()?{name}\b", expr)
            assert taken == ["max without (instance)"], f"{expr}: {name} not taken as its replicas' max"


@pytest.mark.parametrize(
    "lost", [nats.errors.ConnectionClosedError(), nats.errors.StaleConnectionError(), OSError(104, "reset")]
)
async def test_a_question_on_a_connection_lost_under_it_is_refused_not_raised_through(
    lost: Exception,
) -> None:
    # The dashboard's feed turns a refusal into a problem shown and a new session; any other
    # error ended the feed for good, its last board shown as live.
    from corral.services.query.client import Refused, Session

    class Closed:
        async def request(self, *args: object, **kwargs: object) -> object:
            raise lost

    s = Session(timeout=1.0)
    s.nc = Closed()  # type: ignore[assignment]
    with pytest.raises(Refused, match="no answer on"):
        await s.ask("a", "gpus")


async def test_a_busy_answer_keeps_the_feeds_session_and_the_board_follows_after() -> None:
    # Past its share of the read service's time, a tenant's dashboard was answered busy: the
    # feed took it for a broken session, closed it and opened another every second, asking
    # again sooner than the answer said. It shows why it is stale, keeps the session and asks
    # again when told; the board then follows as before.
    import asyncio

    from corral.services.dashboard import app

    opened: list[object] = []
    closed: list[object] = []
    busy = {"seq": 3, "error": "busy: ask again in 0.1 s", "busy": True, "retry_s": 0.1}
    answers = {"gpus": [busy, {"seq": 3, "nodes": []}], "queues": [{"seq": 3, "queues": []}]}

    class Session:
        async def ask(self, asker: str, question: str, **fields: Any) -> dict[str, Any]:
            left = answers.get(question) or [{"seq": 3, question: []}]
            return left.pop(0) if len(left) > 1 else left[0]

        async def close(self) -> None:
            closed.append(self)

    async def session() -> Session:
        opened.append(Session())
        return opened[-1]  # type: ignore[return-value]

    feed = app.Feed("nats://nowhere", "team-a", None, min_interval=0.01)
    feed._session = session  # type: ignore[method-assign]
    following = asyncio.create_task(feed.run())
    try:
        seen = await feed.wait_newer(0, 10.0)
        assert feed.problem.startswith("busy") and feed.board is None
        while feed.board is None:
            seen = await feed.wait_newer(seen, 10.0)
        assert feed.problem == "" and len(opened) == 1 and not closed
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
