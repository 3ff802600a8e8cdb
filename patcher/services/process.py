"""The agent as a process: the stop signals it hears and the folders it watches. Both only put on the agent's
event queue (``request_stop``, the watcher's events); the agent's thread does everything else.
"""

from __future__ import annotations

import logging
import posixpath
import signal
from collections.abc import Callable

from patcher.adapters import signals
from patcher.adapters.health import Metrics
from patcher.adapters.watch import FolderWatcher, file_fingerprint, folder_fingerprint
from patcher.core.errors import PatcherError
from patcher.core.settings import Files
from patcher.services import engine

log = logging.getLogger("patcher.services.agent")


class StopSignal:
    """SIGTERM/SIGINT as a stop request, and the one log line that says which signal came."""

    def __init__(self, *, log_extra: dict[str, str]) -> None:
        self.signum: int | None = None  # the stop signal received, until its log line is said (issue 26)
        self._log_extra = log_extra

    def install(self, request_stop: Callable[[], None]) -> None:
        """Stop on SIGTERM/SIGINT, including one that came before this call (while the process started)."""
        if signals.installed_at is None:
            signals.install()

        def on_signal(signum: int) -> None:
            # Nothing but the stop request here: the handler runs on the loop's thread, so every line of it
            # comes before the restore. The "received" line is said once the manifest is back (``say``): as
            # the handler's first write it cost SIGTERM -> restored a quarter of a millisecond (issue 26).
            if self.signum is None:
                self.signum = signum
            request_stop()

        signals.subscribe(on_signal)

    def say(self) -> None:
        """Log the stop signal received, once: after the restore's write (or before a stop that keeps)."""
        signum, self.signum = self.signum, None
        if signum is not None:
            log.info("received %s", signal.Signals(signum).name, extra=self._log_extra)


def watch_folders(files: Files, put: Callable[[str], None], *, debounce: float, metrics: Metrics,
                  log_extra: dict[str, str]) -> FolderWatcher:
    """Start the watch of the source ("source") and of the kubelet's manifest folder ("manifest"), and of a
    symlinked manifest's target folder. A folder that cannot be watched is logged and counted: the periodic
    resync still covers it."""
    fs = engine.host_fs(files)
    manifest_local = fs.local(files.manifest_path)
    watcher = FolderWatcher(put, debounce=debounce)
    targets = [("source", files.source, lambda: folder_fingerprint(files.source)),
               ("manifest", fs.local(files.manifest_dir), lambda: file_fingerprint(manifest_local))]
    target_dir = posixpath.dirname(fs.resolve(files.manifest_path))
    if posixpath.normpath(target_dir) != posixpath.normpath(files.manifest_dir):
        # A symlinked manifest is edited at its target: a change there raises no event in the kubelet's folder.
        targets.append(("manifest", fs.local(target_dir), lambda: file_fingerprint(manifest_local)))
    for name, folder, fingerprint in targets:
        try:
            watcher.add(name, folder, fingerprint)
        except PatcherError as exc:  # keep running: the periodic resync still covers it
            metrics.error("watch")
            log.error("cannot watch %s: %s; relying on the periodic resync", name, exc, extra=log_extra)
    watcher.start()
    return watcher
