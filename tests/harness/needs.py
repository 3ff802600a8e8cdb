"""A test that needs an outside tool (helm, promtool, go) skips with one line where the tool cannot be had, and
fails instead under ``CI=true``: CI installs every tool the suite uses, so a skip there would hide a broken
install behind a green run."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(why: str) -> NoReturn:
    """Skip the calling test (or module, at import) with ``why``; under ``CI=true`` fail with it."""
    if in_ci():
        pytest.fail(f"{why} (CI=true: every tool the tests need must be installed)", pytrace=False)
    pytest.skip(why, allow_module_level=True)
