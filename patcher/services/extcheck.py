"""The extender probe for one rendered config on this node: ``plan``/``apply --check-extenders`` and the agent's
pre-flight share it, so a laptop dry run and the node agent judge an extender the same way.

TLS files named in the config are node paths, read below the host root (``--host-root``), where the scheduler's
own hostPath mounts find them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from patcher.adapters.extprobe import probe_all
from patcher.core import extprobe, lifecycle
from patcher.core.schedconfig import RenderedConfig
from patcher.core.settings import Files
from patcher.services import engine

log = logging.getLogger("patcher.services.agent")


@functools.lru_cache(maxsize=8)
def _targets(config_hash: str, files: tuple[tuple[str, bytes], ...]) -> tuple[extprobe.Target, ...]:
    """The targets of one rendered config, parsed once: the agent probes the same config before the write,
    after the restart and every minute while Ready."""
    return tuple(extprobe.targets(dict(files)))


def check(opts: Files, config: RenderedConfig, *, cancel: threading.Event | None = None,
          deadline: float | None = None) -> list[extprobe.Result]:
    """Probe every extender of ``config`` at once; one result each, in config order."""
    fs = engine.host_fs(opts)
    found = _targets(config.config_hash, tuple(sorted(config.files.items())))
    return probe_all(found, local=lambda p: str(fs.local(p)), cancel=cancel, deadline=deadline)


def as_data(results: list[extprobe.Result]) -> list[dict[str, object]]:
    """The ``-o json``/``yaml`` form: one object per extender."""
    return [{"url": r.url, "answered": r.answered, "ignorable": r.ignorable, "skipped": r.skipped,
             "error": r.error or None, "seconds": round(r.seconds, 3)} for r in results]


def start_probe(opts: Files, config: RenderedConfig, *, cancel: threading.Event,
                done: Callable[[lifecycle.Probed], None], log_extra: dict[str, str],
                observe: Callable[[list[extprobe.Result]], None] | None = None) -> None:
    """The agent's probe, in a thread of its own: the loop keeps beating and a SIGTERM is handled at once (the
    probe is cancelled, not awaited). ``done`` gets the answer as the ``lifecycle.Probed`` to feed; ``observe``
    (the metrics) gets every extender's result first, so the gauges an alert reads are current when the state
    changes."""

    def run() -> None:
        try:
            results = check(opts, config, cancel=cancel)
        except Exception as exc:  # a bug in the probe must not pass for an answer
            log.debug("extender probe failed", exc_info=True)
            answer = lifecycle.Probed(time.monotonic(), config.config_hash,
                                      blocking=f"extender probe failed: {type(exc).__name__}: {exc}")
        else:
            for result in results:
                log.info("extender %s", result.line(), extra=log_extra)
            if observe is not None:
                observe(results)
            answer = lifecycle.Probed(time.monotonic(), config.config_hash,
                                      blocking=extprobe.summary(extprobe.blocking(results)),
                                      ignored=extprobe.summary(r for r in results if r.ignorable))
        done(answer)

    threading.Thread(target=run, name="extender-probe", daemon=True).start()
