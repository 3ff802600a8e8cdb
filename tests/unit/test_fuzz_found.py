"""Every input the fuzzers ever failed on, replayed as an ordinary test, and every target's seeds (issue 32).

``fuzz/run.py`` (``make fuzz``, the short pass in ``.ci/run``) drives the targets of ``fuzz/targets.py`` with
atheris; what it found is fixed in the code and its input kept in ``tests/fuzz_found/<target>/``: this file
replays each one on every ``make test``, without atheris, so a regression fails here, named by its file. The
seeds in ``fuzz/corpus/<target>/seed-*`` run too: they keep each target working (a target that raised on its
own seeds would fuzz nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
FOUND = sorted(p for p in (ROOT / "tests" / "fuzz_found").glob("*/*") if p.is_file())
SEEDS = sorted((ROOT / "fuzz" / "corpus").glob("*/seed-*"))


def test_every_target_has_seeds_and_every_found_input_a_target() -> None:
    assert {p.parent.name for p in SEEDS} == set(TARGETS)
    assert {p.parent.name for p in FOUND} <= set(TARGETS)


@pytest.mark.parametrize("path", FOUND, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_an_input_a_target_once_failed_on(path: Path) -> None:
    TARGETS[path.parent.name](path.read_bytes())


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_seed(path: Path) -> None:
    TARGETS[path.parent.name](path.read_bytes())
