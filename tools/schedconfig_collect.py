"""A pytest plugin that records every KubeSchedulerConfiguration text the schedconfig tests parse (issue 33).

The project's own tests are the first part of the oracle's case set. Their configs are written in many shapes
(module constants, f-strings, helpers that assemble profiles), so reading the test sources would miss most of
them; recording what reaches the YAML loader while the tests run catches every one, whatever its shape:

    SCHEDCONFIG_COLLECT=out.json python -m pytest -q -p tools.schedconfig_collect tests/unit/test_schedconfig_*.py

The texts are sorted and deduplicated, so the output is stable across runs; property tests (hypothesis), whose
configs are random draws, are left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.core.schedconfig import yamlio

SEEN: set[str] = set()


def _wanted(text: str) -> bool:
    """A scheduler config of the kubescheduler.config.k8s.io group, small enough to be a hand-written case."""
    return "KubeSchedulerConfiguration" in text and "kubescheduler.config.k8s.io" in text and len(text) < 20_000


@pytest.fixture(autouse=True)
def _record(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if getattr(getattr(request.node, "function", None), "is_hypothesis_test", False):
        yield  # property tests draw random configs: not a fixed case, and the case set must be reproducible
        return
    original = yamlio.load_documents

    def recording(text: str, path: str) -> list[Any]:
        if isinstance(text, str) and _wanted(text):
            SEEN.add(text)
        return original(text, path)

    monkeypatch.setattr(yamlio, "load_documents", recording)
    yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("SCHEDCONFIG_COLLECT")
    if out:
        Path(out).write_text(json.dumps(sorted(SEEN), indent=0) + "\n")
