"""The real file operations (``fsio.FileOps``), calling a test's hook first at each step a test forces: where a
temp file is made (``"create"``, its target's path: an ``OSError`` the hook raises is the kernel's answer, which
is how tests running as root meet a read-only or full folder), right before a checked rename (``"before-rename"``)
and when a writer waits for a lock another writer holds (``"lock-busy"``). Handed to the writer as its ``ops``
(``nodefiles.apply(..., ops=)``, ``runner.build_agent(..., file_ops=)``); nothing is patched."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from patcher.adapters import fsio

Hook = Callable[[str, Path], None]


class Hooked(fsio.FileOps):
    def __init__(self, hook: Hook | None = None) -> None:
        self.hook = hook

    @contextlib.contextmanager
    def calling(self, hook: Hook) -> Iterator[Hooked]:
        """The hook is called inside the block only: after it, the file system works again."""
        self.hook = hook
        try:
            yield self
        finally:
            self.hook = None

    def _call(self, point: str, path: Path) -> None:
        hook = self.hook
        if hook is not None:
            hook(point, path)

    def create_temp(self, path: Path) -> tuple[int, str]:
        self._call("create", path)
        return super().create_temp(path)

    def before_rename(self, path: Path) -> None:
        self._call("before-rename", path)

    def sleep(self, seconds: float) -> None:
        self._call("lock-busy", Path())
        super().sleep(seconds)
