"""A small real training job for corral: logistic regression in numpy, trained step by step by
mini-batch gradient descent on synthetic data from a fixed seed, that checkpoints when corral asks
and resumes from the step it saved.

It follows corral's checkpoint contract (see ``services/agent/workers.py``):

- on ``SIGUSR1``, or when ``$CORRAL_CHECKPOINT_DIR/REQUEST`` appears, it saves weights and step to
  ``$CORRAL_CHECKPOINT_DIR/step-<N>.npz`` and writes ``DONE`` (``{"step": N, "location": ...}``);
- on ``SIGTERM`` it stops after the current step and exits 0;
- with ``$CORRAL_RESUME_FROM`` it loads that checkpoint and continues from its step.

Each step's mini-batch is drawn from a generator seeded by (seed, step), so a run resumed at step S
ends with exactly the weights of a run that never stopped.

With OpenTelemetry installed and a collector configured (``OTEL_EXPORTER_OTLP_ENDPOINT``, which
corral's agent passes on), it adds its own spans to its job's trace, under the worker's run that
``$TRACEPARENT`` names: the training loop, each checkpoint it saves, its loss as it goes.

    python examples/train.py --steps 500
"""

from __future__ import annotations

import signal

# Handlers first, before numpy's import: a request that arrives while starting is not lost.
_asked = {"checkpoint": False, "stop": False}
signal.signal(signal.SIGUSR1, lambda *_: _asked.__setitem__("checkpoint", True))
signal.signal(signal.SIGTERM, lambda *_: _asked.__setitem__("stop", True))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

FEATURES = 16
SAMPLES = 2048


def dataset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES))
    true_w = rng.normal(size=FEATURES)
    y = (x @ true_w + 0.5 * rng.normal(size=SAMPLES) > 0).astype(np.float64)
    return x, y


def sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-z))
    return out


def loss_and_accuracy(w: np.ndarray, b: float, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = np.clip(sigmoid(x @ w + b), 1e-12, 1 - 1e-12)
    loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return loss, float(np.mean((p > 0.5) == (y > 0.5)))


def save(directory: Path, step: int, w: np.ndarray, b: float) -> Path:
    """Write the checkpoint, then DONE, each by rename: a reader never sees half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.npz"
    tmp = directory / f".step-{step:08d}.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, w=w, b=np.array(b), step=np.array(step))
    os.replace(tmp, path)
    done_tmp = directory / ".DONE.tmp"
    done_tmp.write_text(json.dumps({"step": step, "location": str(path)}))
    os.replace(done_tmp, directory / "DONE")
    return path


class Spans:
    """This job's own spans in its corral trace, when it can make them; else nothing at all."""

    def __init__(self) -> None:
        self.tracer = None
        parent = os.environ.get("TRACEPARENT")
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
        if not parent or not endpoint:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            return  # a job without OpenTelemetry trains all the same
        self.provider = TracerProvider(resource=Resource.create(), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=2.0)))
        self.tracer = self.provider.get_tracer("corral.examples.train")
        self.context = TraceContextTextMapPropagator().extract({"traceparent": parent})

    def start(self, name: str, **attributes: Any) -> Any:
        if self.tracer is None:
            return None
        return self.tracer.start_span(name, context=self.context, attributes=attributes)

    def child(self, parent: Any, name: str, **attributes: Any) -> Any:
        if self.tracer is None or parent is None:
            return None
        from opentelemetry import trace

        return self.tracer.start_span(name, context=trace.set_span_in_context(parent), attributes=attributes)

    def close(self) -> None:
        """Send what is left, for a moment only: a dead collector must not keep a job from ending."""
        if self.tracer is None:
            return
        import threading

        flush = threading.Thread(target=self.provider.force_flush, daemon=True)
        flush.start()
        flush.join(1.0)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="train until this many steps are done")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps")
    ap.add_argument("--step-seconds", type=float, default=0.0, help="pace each step (demos)")
    args = ap.parse_args(argv)

    ckpt_dir = Path(os.environ.get("CORRAL_CHECKPOINT_DIR", "checkpoints"))
    request = ckpt_dir / "REQUEST"
    rank = os.environ.get("RANK", "0")
    x, y = dataset(args.seed)
    w, b, step = np.zeros(FEATURES), 0.0, 0
    resume = os.environ.get("CORRAL_RESUME_FROM")
    if resume:
        with np.load(resume) as saved:
            w, b, step = saved["w"], float(saved["b"]), int(saved["step"])
        print(f"rank {rank}: resumed from step {step} ({resume})", flush=True)
    else:
        print(f"rank {rank}: starting from step 0", flush=True)

    spans = Spans()
    training = spans.start("train", **{"train.start_step": step, "train.steps": args.steps})
    saved_at = step
    while True:
        periodic = args.checkpoint_every and step % args.checkpoint_every == 0 and step != saved_at
        if _asked["checkpoint"] or request.exists() or periodic:
            _asked["checkpoint"] = False
            request.unlink(missing_ok=True)  # answered: the next request is a new one
            saving = spans.child(training, "checkpoint", **{"train.step": step})
            print(f"rank {rank}: checkpoint at step {step} -> {save(ckpt_dir, step, w, b)}", flush=True)
            if saving is not None:
                saving.end()
            saved_at = step
        if step >= args.steps or _asked["stop"]:
            break
        idx = np.random.default_rng([args.seed, step]).integers(0, SAMPLES, args.batch)
        xb, yb = x[idx], y[idx]
        err = sigmoid(xb @ w + b) - yb
        w = w - args.lr * (xb.T @ err) / args.batch
        b = b - args.lr * float(np.mean(err))
        step += 1
        if step % args.log_every == 0:
            loss, acc = loss_and_accuracy(w, b, x, y)
            print(f"rank {rank}: step {step} loss {loss:.4f} accuracy {acc:.3f}", flush=True)
            if training is not None:
                training.add_event("loss", {"train.step": step, "train.loss": loss, "train.accuracy": acc})
        if args.step_seconds:
            time.sleep(args.step_seconds)

    loss, acc = loss_and_accuracy(w, b, x, y)
    how = "stopped" if _asked["stop"] else "done"
    print(f"rank {rank}: {how} at step {step} loss {loss:.6f} accuracy {acc:.3f}", flush=True)
    if training is not None:
        training.set_attribute("train.end_step", step)
        training.end()
    spans.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
