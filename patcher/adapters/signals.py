"""SIGTERM/SIGINT caught from the first milliseconds of the process, before anything heavy is imported.

The kubelet may send SIGTERM while the agent is still starting (a pod deleted right after a restart): with the
default handler the process would die mid-start, possibly with the manifest patched and nobody to undo it.
So the entry point installs these handlers before it imports the rest of the package; a signal that comes
early is remembered and handed to whoever subscribes later (the agent, once it knows the manifest's state).
Standard library only, and only what the handlers need (``_thread``'s lock, not ``threading``; the typing
names are not imported at run time): everything before the handlers are in is on the exec -> signal-safe
path, so it must be short.
"""

from __future__ import annotations

import _thread
import signal

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (not free); mypy reads it as the same

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = _thread.allocate_lock()
_received: list[int] = []
_listeners: list[Callable[[int], None]] = []


def _handler(signum: int, frame: FrameType | None) -> None:
    with _lock:
        _received.append(signum)
        listeners = list(_listeners)
    for listener in listeners:
        listener(signum)


def install() -> None:
    """Catch SIGTERM and SIGINT from now on (main thread only, like ``signal.signal``); again: nothing changes."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)


def install_for(argv: Sequence[str]) -> bool:
    """Install for the long-running ``run`` command only: a one-shot ``apply`` keeps the default (die at once).

    The command is the first word that is not a flag, the same rule ``cli.main`` uses to pick it."""
    command = next((w for w in argv if not w.startswith("-")), None)
    if command != "run":
        return False
    install()
    return True


def subscribe(listener: Callable[[int], None]) -> None:
    """Call ``listener(signum)`` for every stop signal; at once for one that already came before this call."""
    with _lock:
        _listeners.append(listener)
        early = _received[0] if _received else None
    if early is not None:
        listener(early)

