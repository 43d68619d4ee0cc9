"""Job and queue files as people write them: TOML, YAML or JSON, chosen by the file's suffix.

A file that does not parse or does not describe a valid job is a ``BadInput`` with a one-line
message naming the file and the field, never a traceback.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec
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
    try:
        match p.suffix.lower():
            case ".toml":
                return tomllib.loads(text)
            case ".yaml" | ".yml":
                return yaml.safe_load(text)
            case ".json":
                return json.loads(text)
            case _:
                raise BadInput(f"{p}: unknown file type {p.suffix!r} (use .toml, .yaml or .json)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"{p}: not valid {p.suffix.lstrip('.').upper()}: {first}") from None


def convert(doc: Any, kind: type[T], where: str) -> T:
    try:
        return msgspec.convert(doc, kind, strict=False)
    except msgspec.ValidationError as e:
        raise BadInput(f"{where}: {e}") from None
