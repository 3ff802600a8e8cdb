"""The agent as a process: the writer lock held while it runs, the stop signals it hears and the folders it
watches. The signals and the watch only put on the agent's event queue (``request_stop``, the watcher's
events); the agent's thread does everything else. ``runner.run`` calls these in order: the signal handlers
first (before anything slow), then the watch, then ``run``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import posixpath
from collections.abc import Callable

from patcher.adapters import signals
from patcher.adapters.watch import FolderWatcher
from patcher.core import fileread
from patcher.core.errors import PatcherError
from patcher.core.lifecycle import LoopEvent
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.services import nodefiles
from patcher.services.agent import Agent

log = logging.getLogger("patcher.services.agent")


def run(agent: Agent, settled: Callable[[], object] | None = None) -> int:
    """Start the agent, run its loop until stopped, then stop as the step says; returns the exit code. The
    node's writer lock is held for the whole run (``record.RecordKeeper.hold_for_life``): 1 at once when another
    writer holds it. ``settled``: see ``Agent.loop``."""
    with contextlib.ExitStack() as stack:
        if not agent.record.hold_for_life(stack, agent.metrics):
            return 1
        if agent.start():
            agent.loop(settled)
        return agent.shutdown()


def install_signal_handlers(agent: Agent) -> None:
    """Stop on SIGTERM/SIGINT, including one that came before this call (while the process started)."""
    signals.install()
    signals.subscribe(lambda signum: agent.request_stop(signum=signum))


def start_watching(agent: Agent) -> None:
    """Watch the source ("source"), the kubelet's manifest folder ("manifest") and a symlinked manifest's
    target folder, and the host config folder ("config": a config file the manifest names, deleted there, is
    written back at once, not at the next resync; what it compares is ``nodefiles.named_missing_fingerprint``).
    A folder that cannot be watched is logged and counted: the periodic resync still covers it."""
    files = agent.files
    fs = nodefiles.host_fs(files)
    watcher = FolderWatcher(lambda name: agent.events.put(LoopEvent(name)), debounce=agent.opts.debounce)
    # Bounded as the reads they announce: a FIFO or a huge file is a fingerprint, never a read that hangs.
    manifest: Callable[[], str] = functools.partial(fileread.fingerprint, fs.local(files.manifest_path),
                                                    limit=nodefiles.MAX_MANIFEST_BYTES)
    targets = [(LoopEvent.SOURCE, files.source,
                lambda: fileread.folder_fingerprint(files.source, limit=MAX_SOURCE_BYTES)),
               (LoopEvent.MANIFEST, fs.local(files.manifest_dir), manifest)]
    target_dir = posixpath.dirname(fs.resolve(files.manifest_path))
    if posixpath.normpath(target_dir) != posixpath.normpath(files.manifest_dir):
        # A symlinked manifest is edited at its target: a change there raises no event in the kubelet's folder.
        targets.append((LoopEvent.MANIFEST, fs.local(target_dir), manifest))
    targets.append((LoopEvent.CONFIG, fs.local(files.host_config_dir),
                    lambda: nodefiles.named_missing_fingerprint(files)))
    for name, folder, fingerprint in targets:
        try:
            watcher.add(name, folder, fingerprint, missing_ok=name is LoopEvent.CONFIG)
        except PatcherError as exc:  # keep running: the periodic resync still covers it
            agent.metrics.error("watch")
            log.error("cannot watch %s: %s; relying on the periodic resync", name, exc, extra=agent.log_extra)
    watcher.start()
    agent.world.watcher = watcher
