"""The JSON Schema files in schema/ are what the msgspec types say, every request's and event's:
regenerated here and compared, so no type changes without its contract for other languages."""

from __future__ import annotations

import json
from pathlib import Path

from corral.events import codec
from corral.events.schema import documents, stale, write

SCHEMA = Path(__file__).resolve().parents[2] / "schema"


def test_the_committed_schema_is_the_types() -> None:
    assert stale(SCHEMA) == [], "regenerate with: python -m corral.events.schema"


def test_every_verb_and_every_event_type_has_its_schema() -> None:
    docs = documents()
    assert {f"requests/{verb}.json" for verb in codec.ADMIN_VERBS} <= set(docs)
    body = docs["events.json"]["$defs"]["Envelope"]["properties"]["body"]
    tagged = {ref["$ref"].rsplit("/", 1)[1] for ref in body["anyOf"]}
    assert tagged == {t.__name__ for t in codec.EVENT_TYPES}


def test_a_request_may_leave_its_tag_out_an_event_may_not() -> None:
    docs = documents()
    submit = docs["requests/submit.json"]["$defs"]["SubmitJob"]
    assert submit["required"] == ["request_id", "job"] and submit["additionalProperties"] is False
    assert "type" in docs["events.json"]["$defs"]["SubmitJob"]["required"]


def test_a_stale_or_stray_file_is_named(tmp_path: Path) -> None:
    write(tmp_path)
    assert stale(tmp_path) == []
    cancel = tmp_path / "requests" / "cancel.json"
    doc = json.loads(cancel.read_text())
    doc["$defs"]["CancelJob"]["properties"].pop("reason")
    cancel.write_text(json.dumps(doc))
    (tmp_path / "requests" / "gone.json").write_text("{}")
    assert stale(tmp_path) == ["requests/cancel.json", "requests/gone.json"]
