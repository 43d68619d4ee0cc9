"""Fixtures of the integration tests that read what corral exports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.services.runtime import tracing
from tests.otlp import Receiver, receiver


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """An OTLP receiver every span of this process goes to (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    tracing.shutdown()  # providers made earlier in this process export nowhere: start afresh
    with receiver() as got:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.url)
        try:
            yield got
        finally:
            tracing.shutdown()
