"""Job and queue files as people write them: TOML, YAML or JSON, chosen by the file's suffix.

A file that does not parse or does not describe a valid job is a ``BadInput`` with a one-line
message naming the file and, in the person's words, where: the line and column of a syntax
error; the path of a field (``resources.gpus``) that is unknown (with the closest known one),
of the wrong type (with the type expected) or missing. Every unknown field of a file is named
at once: a file with two typos is one round trip, not two.

A job's command runs on a node, in the worker's own directory (``work/<job>/run-<n>/attempt-<a>/rank-<r>``
under its agent's work directory), not where it was submitted from; ``command_here`` makes the
relative paths of a command mean what they meant to the person who typed them.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from corral.events import documents

T = TypeVar("T")


class BadInput(ValueError):
    pass


# The largest job or queue file read: a job is at most a request's 256 KiB on the wire, and a
# queue file of thousands of queues is far below this. A path that is a link to /dev/zero would
# otherwise be read until memory ran out.
MAX_DOCUMENT = 4 * 1024 * 1024


def read_document(p: Path) -> str:
    """The text of the file at ``p``: a regular file of at most ``MAX_DOCUMENT`` bytes, UTF-8
    (a leading byte-order mark, as some editors write, is skipped), or a BadInput saying why
    not. Opened without blocking: a FIFO would hold the command until someone wrote to it."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise BadInput(f"{p}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(f"{p}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_DOCUMENT + 1)
    except OSError as e:
        raise BadInput(f"{p}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_DOCUMENT:
        raise BadInput(f"{p}: larger than any job or queue file is ({MAX_DOCUMENT} bytes at most)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{p}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None


def load_document(path: str | Path) -> Any:
    p = Path(path)
    text = read_document(p)
    kind = p.suffix.lstrip(".").upper()
    try:
        match p.suffix.lower():
            case ".toml":
                return tomllib.loads(text)
            case ".yaml" | ".yml":
                return yaml.load(text, _UniqueKeys)  # a SafeLoader that refuses a key given twice
            case ".json":
                return json.loads(text, object_pairs_hook=documents.unique_keys)
            case _:
                raise BadInput(f"{p}: unknown file type {p.suffix!r} (use .toml, .yaml or .json)")
    except tomllib.TOMLDecodeError as e:
        # tomllib says where at the end of its message: "... (at line 3, column 7)".
        m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(e))
        where, what = (f"{p}:{m[2]}:{m[3]}", m[1]) if m else (str(p), str(e))
        raise BadInput(f"{where}: not valid TOML: {what}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        what = " ".join(s for s in (e.context, e.problem) if s) or type(e).__name__
        raise BadInput(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise BadInput(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except _Duplicate as e:
        raise BadInput(f"{p}:{e.where}: not valid {kind}: {e.key!r} given twice") from None
    except documents.GivenTwice as e:  # json gives no position to its hook
        raise BadInput(f"{p}: not valid {kind}: {e}") from None
    except _NoKey as e:
        raise BadInput(f"{p}:{e.where}: not valid {kind}: a key must be a name, not {e.kind}") from None
    except RecursionError:
        raise BadInput(f"{p}: not valid {kind}: nested deeper than any job or queue is") from None


class _NoKey(ValueError):
    def __init__(self, kind: str, where: str) -> None:
        self.kind, self.where = kind, where


class _Duplicate(ValueError):
    def __init__(self, key: str, where: str) -> None:
        self.key, self.where = key, where


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a person who wrote ``resources`` twice meant
    something by the first one, so that is refused, with where the second one is."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):  # a list or a mapping as a key
                mark = key_node.start_mark
                raise _NoKey(type(key).__name__, f"{mark.line + 1}:{mark.column + 1}")
            if key in seen:
                mark = key_node.start_mark
                raise _Duplicate(str(key), f"{mark.line + 1}:{mark.column + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def convert(doc: Any, kind: type[T], where: str, also: Sequence[str] = ()) -> T:
    """``doc`` as a ``kind``, or a BadInput saying what is wrong where (``events.documents``:
    the one rule, which the Python client's ``submit`` of a dict follows too)."""
    try:
        return documents.convert(doc, kind, where, also)
    except documents.NotValid as e:
        raise BadInput(str(e)) from None


# -- the command's paths ----------------------------------------------------------------------

# A relative argument with one of these suffixes names a script: if it is not where the job is
# submitted from, the worker would not find it either, so the job would only fail on its node.
SCRIPTS = (".py", ".sh", ".bash", ".js", ".mjs", ".rb", ".pl", ".r", ".jl", ".lua")


def command_here(command: Sequence[str], here: Path) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """The command with each relative argument that names a file or directory in ``here`` (the
    submit's working directory) made absolute, and the ``(given, absolute)`` pairs changed.

    Workers run in a directory of their own, as on a cluster where the submitting machine's
    directory is not the node's; the person who typed ``python train.py`` meant the train.py in
    front of them, so it becomes that file's absolute path (nodes see it through a shared
    filesystem, as with Slurm, or by being the same machine). A relative program or script that
    is not there is refused now, with why, rather than failing later on the node. Other
    arguments (``--steps``, ``100``, an output path not made yet) are left as given: relative to
    the worker's own directory, where it may write.
    """
    out: list[str] = []
    changed: list[tuple[str, str]] = []
    for i, arg in enumerate(command):
        if not arg or arg.startswith(("/", "-", "~")) or "://" in arg or any(c.isspace() for c in arg):
            out.append(arg)
            continue
        if i == 0 and "/" not in arg:
            out.append(arg)  # a program by its name: found on the PATH, as a shell finds it
            continue
        path = here / arg
        # A directory only when written as a path: ``python -m train`` names a module, and
        # a folder train/ beside it does not make it ``python -m /home/me/train``.
        try:
            found = path.is_file() or ("/" in arg and path.is_dir())
        except OSError:  # no file's name (longer than one may be), or under a folder not readable
            found = False
        if found:
            absolute = str(path.resolve())
            out.append(absolute)
            changed.append((arg, absolute))
            continue
        if i == 0 or arg.lower().endswith(SCRIPTS):
            raise BadInput(
                f"command: {arg} is not in {here}, where relative paths are taken from (workers "
                "run in a directory of their own): give its absolute path, or submit from the "
                "directory that holds it"
            )
        out.append(arg)
    return tuple(out), changed
