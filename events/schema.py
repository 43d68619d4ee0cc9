"""The wire contract as JSON Schema, generated from the msgspec types, for clients in any language.

``python -m corral.events.schema [DIR]`` writes, under ``DIR`` (``schema/`` of the source tree):

- ``requests/<verb>.json``: the body of a request on ``corral.req.<tenant>.<verb>`` (the intake
  appends it as is at ``corral.in.<tenant>.<verb>``), one file per verb, the admin's included;
- ``events.json``: a record on ``corral.ev.>``, the envelope every service event travels in, its
  ``body`` one of the event types (tagged by ``type``).

``--check`` writes nothing and exits 1 naming each file that differs from what the types say
(``tests/unit/test_wire_schema.py`` runs the same comparison). The types are the contract; these
files are their readable, checked copy, regenerated whenever a type changes.

A request's ``type`` tag is optional (the verb in the subject says what it is), so it is left out
of the request's own ``required``; inside an event's envelope the tag is what tells the types
apart, and is required there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from corral.events.codec import ADMIN_VERBS, Envelope

DIALECT = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/{name}"


def _document(title: str, description: str, root: type, *, tag_optional: bool = False) -> dict[str, Any]:
    (ref,), defs = msgspec.json.schema_components([root], ref_template=REF)
    if tag_optional:
        own = defs[root.__name__]
        own["required"] = [f for f in own.get("required", []) if f != "type"]
    return {"$schema": DIALECT, "title": title, "description": description, **ref, "$defs": defs}


def documents() -> dict[str, dict[str, Any]]:
    """Each schema file's path (relative to the schema folder) and its content."""
    out = {
        f"requests/{verb}.json": _document(
            f"corral request: {verb}",
            f"The body of a request on corral.req.<tenant>.{verb}; answered by the intake with "
            '{"stream", "seq", "duplicate"} (where the log stored it) or {"error": {"code", '
            '"description"}}. Unknown fields are refused; "type" may be left out.',
            request,
            tag_optional=True,
        )
        for verb, request in sorted(ADMIN_VERBS.items())
    }
    out["events.json"] = _document(
        "corral event",
        "A record on corral.ev.>: the envelope of one service event, its body tagged by type. A "
        "reader refuses a record whose v is newer than it knows.",
        Envelope,
    )
    return out


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def stale(folder: Path) -> list[str]:
    """The files under ``folder`` that differ from the types, are missing, or are not theirs."""
    wanted = {name: render(doc) for name, doc in documents().items()}
    found = {str(p.relative_to(folder)) for p in folder.rglob("*.json")} if folder.exists() else set()
    differ = [
        n for n, text in wanted.items() if not (folder / n).exists() or (folder / n).read_text() != text
    ]
    return sorted(differ + sorted(found - set(wanted)))


def write(folder: Path) -> list[str]:
    written = []
    for name, doc in documents().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(doc))
        written.append(name)
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m corral.events.schema", description=__doc__.split("\n")[0])
    p.add_argument("folder", nargs="?", default="schema", help="where the schema files go (default: schema)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file is stale")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    if args.check:
        bad = stale(folder)
        for name in bad:
            print(
                f"{folder / name}: differs from the types (python -m corral.events.schema)", file=sys.stderr
            )
        sys.exit(1 if bad else 0)
    print(f"wrote {len(write(folder))} schema files under {folder}")


if __name__ == "__main__":
    main()
