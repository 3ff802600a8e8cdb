"""Log lines in both formats: JSON in the Kubernetes structured-logging shape, with a constant message."""

from __future__ import annotations

import json
import logging

import pytest

from patcher.adapters.logs import JsonFormatter, TextFormatter


def record(msg: str, *args: object, level: int = logging.INFO, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    rec = logging.LogRecord("patcher.services.agent", level, __file__, 1, msg, args or None, exc_info)
    rec.__dict__.update(extra)
    return rec


def as_json(rec: logging.LogRecord) -> dict[str, object]:
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    parsed: dict[str, object] = json.loads(line)
    return parsed


def test_json_message_is_constant_and_values_are_fields() -> None:
    a = as_json(record("rollout lease acquired for config %s", "abc123def456", node="cp-1", hash="abc123"))
    b = as_json(record("rollout lease acquired for config %s", "0123456789ab", node="cp-2", hash="012345"))
    assert a["msg"] == b["msg"] == "rollout lease acquired for config %s"
    assert list(a)[:5] == ["ts", "v", "level", "logger", "msg"]
    assert isinstance(a["ts"], float) and a["v"] == 0 and a["level"] == "info"
    assert a["args"] == ["abc123def456"] and a["node"] == "cp-1" and a["hash"] == "abc123"


@pytest.mark.parametrize(("level", "v"), [(logging.DEBUG, 4), (logging.INFO, 0), (logging.WARNING, 0),
                                          (logging.ERROR, 0)])
def test_json_verbosity(level: int, v: int) -> None:
    out = as_json(record("x", level=level))
    assert out["v"] == v and "args" not in out


def test_json_exception_is_err_and_odd_values_are_strings() -> None:
    out = as_json(record("cannot write %s: %s", "/etc/x", OSError(28, "No space left"), exc=True, path="/etc/x"))
    assert out["args"] == ["/etc/x", "[Errno 28] No space left"]
    assert isinstance(out["err"], str) and "ValueError: boom" in out["err"]
    assert out["path"] == "/etc/x"


def test_an_extra_key_cannot_overwrite_the_standard_ones() -> None:
    out = as_json(record("m", v=9))
    assert out["v"] == 0


def test_text_interpolates_for_people() -> None:
    line = TextFormatter().format(record("rollout lease acquired for config %s", "abc", node="cp-1"))
    assert line.endswith("INFO    rollout lease acquired for config abc  node=cp-1")
