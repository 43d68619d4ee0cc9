"""Documents as people write them, checked against the wire types, with messages in their words.

A job or queue file (``corral submit -f``, ``corral queue apply``) and a dict given to the Python
client (``Client.submit({...})``) become the same msgspec types, so they are checked by the same
rule, here: every unknown field is named by its whole path (``resources.gpu``) with the closest
known one (``did you mean resources.gpus?``), and a value of the wrong type is said in words
(``resources.gpus: expected an integer, got a string``). Each caller wraps ``NotValid`` in its own
error (the CLI's one-line ``BadInput``, the client's ``Invalid``) after saying which document.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

T = TypeVar("T")


class NotValid(ValueError):
    """A document that is not a valid ``kind``; the message is one line, its ``where`` first."""


def convert(doc: Any, kind: type[T], where: str, also: Sequence[str] = ()) -> T:
    """``doc`` as a ``kind``, or ``NotValid`` saying what is wrong where. ``also`` are top-level
    fields the caller takes out before converting (a job file's ``id``): known, not unknown."""
    unknown = list(unknown_fields(doc, mi.type_info(kind), "", also))
    if unknown:
        raise NotValid(f"{where}: {_unknown_text(unknown)}")
    odd = _not_finite(doc, "")
    if odd is not None:
        at, value = odd
        raise NotValid(f"{where}: {at}: expected a finite number, got {value}")
    try:
        return msgspec.convert(doc, kind, strict=False)
    except msgspec.ValidationError as e:
        raise NotValid(f"{where}: {in_words(str(e), kind)}") from None


def _not_finite(doc: Any, at: str) -> tuple[str, float] | None:
    """The path and value of the first NaN or infinite number in ``doc``, or None. YAML's
    ``.nan`` and ``.inf``, TOML's ``nan`` and ``inf`` and Python's ``NaN`` in JSON are numbers to
    their parsers, and JSON on the wire has none: sent, a job's ``runtime_estimate_s: .inf``
    became null, a job without an estimate, and ``grace_seconds: .nan`` a request the intake
    could not read."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return at, doc
    if isinstance(doc, dict):
        items: Iterable[tuple[str, Any]] = ((f"{at}.{k}" if at else str(k), v) for k, v in doc.items())
    elif isinstance(doc, list | tuple):
        items = ((f"{at}[{i}]", v) for i, v in enumerate(doc))
    else:
        return None
    for path, value in items:
        found = _not_finite(value, path)
        if found is not None:
            return found
    return None


# -- keys given twice ---------------------------------------------------------------------------


class GivenTwice(ValueError):
    """A key given twice in one object: JSON parsers keep the first, the last or either, so a
    document that names a field twice means two things to two readers and is refused."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key!r} given twice")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` that raises ``GivenTwice`` for a repeated key."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise GivenTwice(k)
        out[k] = v
    return out


def given_twice(data: bytes) -> str | None:
    """The first key given twice in one object of the JSON ``data``, or None (also for data
    that is not JSON, or nests past the parser's depth: its decoder says what is wrong)."""
    try:
        json.loads(data, object_pairs_hook=unique_keys)
    except GivenTwice as e:
        return e.key
    except (ValueError, RecursionError):
        pass
    return None


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
