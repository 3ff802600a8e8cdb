"""Figures a bench script hands to ``bench/table.py``: one JSON line each, in the file ``$BENCH_ROWS`` names."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    figure: str
    n: int
    median: float
    p99: float


def timed(fn: Callable[[], object]) -> float:
    """Milliseconds one call of ``fn`` took."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def stats(values: list[float]) -> tuple[float, float]:
    """Median and p99 (the nearest rank below: with fewer than 100 values, the largest)."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def of(figure: str, values: list[float]) -> Row:
    median, p99 = stats(values)
    return Row(figure, len(values), median, p99)


def record(row: Row) -> None:
    """Append ``row`` to ``$BENCH_ROWS`` (nothing when it is not set: the script was run by hand)."""
    target = os.environ.get("BENCH_ROWS")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(row)) + "\n")


def load(path: Path) -> list[Row]:
    if not path.exists():
        return []
    return [Row(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
