"""The health server's stream reader. A module of its own so that asyncio is imported with it, by the server's
thread once it serves (``health.HealthServer``), not by whoever imports the health module: the agent's
start, which imports it, does not pay for asyncio before its first write."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import SupportsIndex

END_OF_HEAD = b"\r\n\r\n"


class HeadReader(asyncio.StreamReader):
    """A stream reader that says when its request's first byte arrives (``on_first``: its head has a short
    deadline from then on) and when the whole head has (``on_head``: from then on the connection carries a
    request and is never evicted). Until the head is complete a connection is as evictable as an idle one
    (else enough half-sent heads hold every slot, and a probe waits for their timeout)."""

    def __init__(self, limit: int, on_head: Callable[[], object], on_partial: Callable[[], object]) -> None:
        """``on_partial``: bytes of a head that is not complete yet were read (the connection, skipped as evictable
        while they waited unread in the kernel, is evictable again)."""
        super().__init__(limit=limit)
        self.received = False
        self.head_done = False
        self._heads = 0  # request heads that arrived and were not answered yet (kept-alive connections)
        self._on_head = on_head
        self._on_partial = on_partial
        self._on_first: Callable[[], object] | None = None
        self._tail = b""  # the last bytes fed: the end of the head may come split across segments

    def when_first_byte(self, callback: Callable[[], object] | None) -> None:
        """Call ``callback`` when the first byte arrives (now, if it has); None forgets it."""
        self._on_first = callback
        if callback is not None and self.received:
            callback()

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        chunk = bytes(data)
        if chunk and not self.received:
            self.received = True
            if self._on_first is not None:
                self._on_first()
        if chunk:
            seen = self._tail + chunk
            self._heads += seen.count(END_OF_HEAD)  # a body holding one only makes the connection look busy
            if self._heads and not self.head_done:
                self.head_done = True
                self._on_head()
            self._tail = seen[-(len(END_OF_HEAD) - 1):]
        super().feed_data(chunk)
        if chunk and not self.head_done:
            self._on_partial()

    def answered(self) -> bool:
        """One request was answered and the connection stays open for the next: True when no other head
        arrived meanwhile (the connection is idle again, evictable, and its next head's deadlines start anew)."""
        self._heads = max(0, self._heads - 1)
        if self._heads:
            return False
        self.received = self.head_done = False
        return True
