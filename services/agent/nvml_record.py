"""What NVML answered on a node, recorded call by call, and answered again from the recording.

A node's GPUs are only ever seen through NVML, and what NVML says differs by GPU, driver,
virtualisation and pynvml version in ways no simulated profile foresees (a VM's GPU with no
NVLink answers, a MIG-mode GPU that hides its memory). ``Recording`` stands in front of pynvml
and writes down every call discovery, health sampling and the XID watch make, with its answer
or the NVML error it raised; ``Replay`` answers the same calls from that list, with pynvml's own
error classes, so a node's discovery runs again anywhere, byte for byte: the tests replay
recordings of real machines, and an operator attaches one to a report of a GPU corral misreads.

``python -m corral.services.agent.nvml_record FILE`` records this machine: one discovery, a
second health sample and a short XID wait, with what discovery returned.

Handles (devices, MIG devices, GPU instances, event sets) are written as tokens (``h0``, ``h1``,
…) by their address, so the same GPU is the same token wherever it appears, also inside an
answer (an XID event's ``device``). Structures are written field by field and come back as
plain objects with the same attributes.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

FORMAT = 1


class Handle:
    """A handle of a replayed NVML: equal to itself and to nothing else, like a real one."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"Handle({self.token})"


class Recording:
    """pynvml (``nvml``), with every ``nvml*`` call written to ``calls``."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.calls: list[dict[str, Any]] = []
        self._tokens: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # its own, not set yet (a copy, an unpickling)
            raise AttributeError(name)
        try:
            attr = getattr(self._nvml, name)
        except AttributeError:
            if name.startswith("nvml"):
                self.calls.append({"fn": name, "missing": True})
            raise
        if not (name.startswith("nvml") and callable(attr)):
            return attr  # error classes, constants
        return lambda *args: self._call(name, attr, args)

    def _call(self, name: str, fn: Any, args: tuple[Any, ...]) -> Any:
        call: dict[str, Any] = {"fn": name, "args": [self._encode(a) for a in args]}
        self.calls.append(call)
        try:
            answer = fn(*args)
        except self._nvml.NVMLError as e:
            call["error"] = type(e).__name__
            call["value"] = getattr(e, "value", None)
            raise
        call["answer"] = self._encode(answer)
        return answer

    def _encode(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, bytes):
            return {"bytes": value.decode("latin-1")}
        if isinstance(value, (list, tuple, ctypes.Array)):
            return {"list": [self._encode(v) for v in value]}
        if isinstance(value, ctypes.Structure):
            fields = {f[0]: self._encode(getattr(value, f[0])) for f in type(value)._fields_}
            return {"struct": type(value).__name__, "fields": fields}
        if isinstance(value, SimpleNamespace):  # a structure of an NVML written in Python
            return {"struct": "", "fields": {k: self._encode(v) for k, v in vars(value).items()}}
        if isinstance(value, ctypes._SimpleCData) and not isinstance(value, ctypes.c_void_p):
            return self._encode(value.value)
        # Anything else is a handle: a ctypes pointer is one by its address (pynvml makes a new
        # pointer object per answer), any other object by its identity.
        if isinstance(value, (ctypes._Pointer, ctypes.c_void_p)):
            address = ctypes.cast(value, ctypes.c_void_p).value or 0
        else:
            address = id(value)
        return {"handle": self._tokens.setdefault(address, f"h{len(self._tokens)}")}


class Replay:
    """NVML answering from a ``Recording``'s calls: each call gets the answers that call got, in
    the order it got them (the last one again once they run out), or raises the error it raised.
    A call the recording never saw raises ``LookupError``: the code asks NVML something the
    machine was never asked, and the replay cannot say what it would have answered."""

    def __init__(self, calls: list[dict[str, Any]], nvml: Any | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        self._handles: dict[str, Handle] = {}
        self._missing = {c["fn"] for c in calls if c.get("missing")}
        self._answers: dict[str, deque[dict[str, Any]]] = {}
        for c in calls:
            if not c.get("missing"):
                self._answers.setdefault(self._key(c["fn"], c["args"]), deque()).append(c)

    @staticmethod
    def _key(fn: str, args: list[Any]) -> str:
        return fn + msgspec.json.encode(args).decode()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # its own, not set yet (a copy, an unpickling)
            raise AttributeError(name)
        if name in self._missing or not name.startswith("nvml"):
            if name in self._missing:
                raise AttributeError(name)
            return getattr(self._nvml, name)
        return lambda *args: self._call(name, args)

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        key = self._key(name, [self._encode(a) for a in args])
        answers = self._answers.get(key)
        if not answers:
            raise LookupError(f"the recording has no answer for {key}")
        call = answers.popleft() if len(answers) > 1 else answers[0]
        if "error" in call:
            error = getattr(self._nvml, call["error"], None)
            if isinstance(error, type) and issubclass(error, self._nvml.NVMLError):
                raise error()
            raise self._nvml.NVMLError(call.get("value"))
        return self._decode(call.get("answer"))

    def _encode(self, value: Any) -> Any:
        if isinstance(value, Handle):
            return {"handle": value.token}
        if isinstance(value, bytes):
            return {"bytes": value.decode("latin-1")}
        if isinstance(value, (list, tuple)):
            return {"list": [self._encode(v) for v in value]}
        return value

    def _decode(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if "handle" in value:
            token = value["handle"]
            return self._handles.setdefault(token, Handle(token))
        if "bytes" in value:
            return value["bytes"].encode("latin-1")
        if "list" in value:
            return tuple(self._decode(v) for v in value["list"])
        return SimpleNamespace(**{k: self._decode(v) for k, v in value["fields"].items()})


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def record(node: str, xid_wait_ms: int = 1000) -> dict[str, Any]:
    """This machine's NVML, recorded: discovery (with NVML required), a second health sample
    and one XID wait of ``xid_wait_ms``, with what each returned."""
    import pynvml

    from corral.services.agent import discovery

    nvml = Recording(pynvml)
    host = discovery.host_resources()
    found = discovery.discover(node, nvml=nvml, fallback=None, host=host)
    gpus = discovery.NvmlGpus(nvml)
    try:
        health = gpus.health()
        watching = gpus.watch_xids()
        xid = gpus.wait_xid(xid_wait_ms) if watching else None
    finally:
        gpus.close()
    return {
        "format": FORMAT,
        "node": node,
        "host": list(host),
        "pynvml": _version("nvidia-ml-py"),
        "xid_wait_ms": xid_wait_ms,
        "calls": nvml.calls,
        "discovery": msgspec.to_builtins(found),
        "health": msgspec.to_builtins(health),
        "watching_xids": watching,
        "xid": msgspec.to_builtins(xid),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m corral.services.agent.nvml_record FILE [NODE]", file=sys.stderr)
        return 2
    from corral.services.agent.discovery import NvmlUnavailable

    node = argv[2] if len(argv) > 2 else os.uname().nodename
    try:
        recorded = record(node)
    except (NvmlUnavailable, ImportError) as e:
        print(f"nothing recorded: {e}", file=sys.stderr)
        return 1
    Path(argv[1]).write_bytes(msgspec.json.format(msgspec.json.encode(recorded)) + b"\n")
    gpus = recorded["discovery"]["inventory"]["gpus"]
    print(f"{argv[1]}: {len(recorded['calls'])} NVML calls, {len(gpus)} GPUs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
