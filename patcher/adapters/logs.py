"""Structured logs: one line per decision, with the node, file and hash as fields.

``text`` for people tailing ``kubectl logs``; ``json`` for log pipelines, in the Kubernetes structured-logging
shape: ``{"ts": <unix seconds>, "v": <verbosity>, "msg": <constant>, <key>: <value>, ...}``. The message is the
call site's template, never the values interpolated into it, so a pipeline can group and alert on ``msg``;
the values are the ``args`` list and the ``extra={...}`` keys (``node``, ``path``, ``hash``, ...), and an
exception is ``err``. Both formats carry the same facts.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from patcher.core.timefmt import rfc3339

_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "v": 4 if record.levelno == logging.DEBUG else 0,  # klog's verbosity: debug 4, the rest 0 (always shown)
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": str(record.msg),
        }
        if record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            out["args"] = [a if isinstance(a, int | float | bool) or a is None else str(a) for a in args]
        for key, value in _fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = rfc3339(int(record.created * 1e9), 3)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname:<7} {record.getMessage()}" + (f"  {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "kubernetes", "watchdog"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
