"""The health server's stream reader. A module of its own so that asyncio is imported with it, by the server's
thread once it serves (``health.HealthServer``), not by whoever imports the health module (issue 26)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import SupportsIndex


class FirstByteReader(asyncio.StreamReader):
    """A stream reader that says when the first byte arrives: from then on its connection carries a request
    and is never evicted as idle."""

    def __init__(self, limit: int, on_data: Callable[[], object]) -> None:
        super().__init__(limit=limit)
        self.received = False
        self._on_data = on_data

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if data and not self.received:
            self.received = True
            self._on_data()
        super().feed_data(data)
