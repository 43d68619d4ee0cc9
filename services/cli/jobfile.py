"""Job and queue files as people write them: TOML, YAML or JSON, chosen by the file's suffix.

A file that does not parse or does not describe a valid job is a ``BadInput`` with a one-line
message naming the file and, in the person's words, where: the line and column of a syntax
error; the path of a field (``resources.gpus``) that is unknown (with the closest known one),
of the wrong type (with the type expected) or missing. Every unknown field of a file is named
at once: a file with two typos is one round trip, not two.

A job's command runs on a node, in the worker's own directory (``work/<job>/attempt-<a>/rank-<r>``
under its agent's work directory), not where it was submitted from; ``command_here`` makes the
relative paths of a command mean what they meant to the person who typed them.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi
import yaml

T = TypeVar("T")


class BadInput(ValueError):
    pass


def load_document(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise BadInput(f"{p}: {e.strerror or e}") from None
    kind = p.suffix.lstrip(".").upper()
    try:
        match p.suffix.lower():
            case ".toml":
                return tomllib.loads(text)
            case ".yaml" | ".yml":
                return yaml.load(text, _UniqueKeys)  # a SafeLoader that refuses a key given twice
            case ".json":
                return json.loads(text, object_pairs_hook=_unique_json)
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
        where = f"{p}:{e.where}" if e.where else str(p)  # json gives no position to its hook
        raise BadInput(f"{where}: not valid {kind}: {e.key!r} given twice") from None


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
            if isinstance(key, str | int | float | bool) and key in seen:
                mark = key_node.start_mark
                raise _Duplicate(str(key), f"{mark.line + 1}:{mark.column + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_json(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k, "")
        out[k] = v
    return out


def convert(doc: Any, kind: type[T], where: str, also: Sequence[str] = ()) -> T:
    """``doc`` as a ``kind``, or a BadInput saying what is wrong where. ``also`` are top-level
    fields the caller takes out before converting (a job file's ``id``): known, not unknown."""
    unknown = list(unknown_fields(doc, mi.type_info(kind), "", also))
    if unknown:
        raise BadInput(f"{where}: {_unknown_text(unknown)}")
    try:
        return msgspec.convert(doc, kind, strict=False)
    except msgspec.ValidationError as e:
        raise BadInput(f"{where}: {in_words(str(e), kind)}") from None


# -- unknown fields ---------------------------------------------------------------------------


def unknown_fields(
    doc: Any, t: mi.Type, path: str, also: Sequence[str] = ()
) -> Iterable[tuple[str, str | None]]:
    """``(path, closest known field or None)`` of every field of ``doc`` that ``t`` does not
    know, however deep. Values of the wrong shape are left to msgspec, which says what it wanted."""
    # msgspec stops at the first unknown field and names its parent only; this walks the same
    # types (msgspec.inspect) to name each one by its whole path.
    struct = _struct_in(t, doc)
    if struct is not None and isinstance(doc, dict):
        fields = {f.encode_name: f for f in struct.fields}
        known = [*fields, *also]
        for key, value in doc.items():
            where = f"{path}.{key}" if path else str(key)
            if key in fields:
                yield from unknown_fields(value, fields[key].type, where)
            elif key not in also:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                yield where, (f"{path}.{close[0]}" if path else close[0]) if close else None
    elif isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType) and isinstance(doc, list):
        for i, item in enumerate(doc):
            yield from unknown_fields(item, t.item_type, f"{path}[{i}]")
    elif isinstance(t, mi.DictType) and isinstance(doc, dict):
        for key, value in doc.items():
            yield from unknown_fields(value, t.value_type, f"{path}.{key}" if path else str(key))
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            if not isinstance(member, mi.NoneType):
                yield from unknown_fields(doc, member, path)
                return


def _struct_in(t: mi.Type, doc: Any) -> mi.StructType | None:
    if isinstance(t, mi.StructType):
        return t
    if isinstance(t, mi.UnionType) and isinstance(doc, dict):
        structs = [m for m in t.types if isinstance(m, mi.StructType)]
        return structs[0] if len(structs) == 1 else None
    return None


def _unknown_text(unknown: list[tuple[str, str | None]]) -> str:
    parts = [f"{p} (did you mean {c}?)" if c else p for p, c in unknown]
    return f"unknown field{'s' if len(parts) > 1 else ''} {', '.join(parts)}"


# -- msgspec's errors in a person's words -------------------------------------------------------

_TYPES = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "object": "a table of fields",
    "array": "a list",
    "null": "nothing",
}


def in_words(message: str, kind: type[Any] | None = None) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.resources.gpus` `` as
    ``resources.gpus: expected an integer, got a string``."""
    m = re.fullmatch(r"(.*?)(?: - at `\$(.*)`)?", message, re.DOTALL)
    assert m is not None  # the pattern matches any text
    what, at = m[1], (m[2] or "").lstrip(".")
    each = at.endswith("[...]")  # msgspec's name for "any key of this table"
    at = at.removesuffix("[...]")
    if got := re.fullmatch(r"Expected `(\w+)`, got `(\w+)`", what):
        what = f"expected {_TYPES.get(got[1], got[1])}, got {_TYPES.get(got[2], got[2])}"
    elif bound := re.fullmatch(r"Expected `(\w+)` (.+)", what):
        what = f"expected {_TYPES.get(bound[1], bound[1])} {bound[2]}"
    elif missing := re.fullmatch(r"Object missing required field `(.+)`", what):
        what = f"missing field {missing[1]}"
    elif enum := re.fullmatch(r"Invalid enum value (.+)", what):
        choices = _choices(kind, at) if kind is not None else ()
        what = (
            f"{enum[1]} is not one of {', '.join(map(str, choices))}" if choices else f"{enum[1]} is unknown"
        )
    else:
        what = what[:1].lower() + what[1:]
    if each:
        what = f"each value: {what}"
    return f"{at}: {what}" if at else what


def _choices(kind: type[Any], at: str) -> tuple[Any, ...]:
    """The values a Literal field at ``at`` takes, for saying them when one is wrong."""
    t: mi.Type = mi.type_info(kind)
    for step in re.findall(r"[^.\[\]]+", at):
        if isinstance(t, mi.UnionType):
            t = next((m for m in t.types if not isinstance(m, mi.NoneType)), t)
        if isinstance(t, mi.StructType):
            t = next((f.type for f in t.fields if f.encode_name == step), t)
        elif isinstance(t, mi.ListType | mi.VarTupleType) and step.isdigit():
            t = t.item_type
        elif isinstance(t, mi.DictType):
            t = t.value_type
    return tuple(t.values) if isinstance(t, mi.LiteralType) else ()


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
        if path.is_file() or ("/" in arg and path.is_dir()):
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
