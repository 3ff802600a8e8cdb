"""What one client's reads cost the API server, counted where its requests leave (tests and benches)."""

from __future__ import annotations

import threading
from typing import Any

from patcher.adapters.kube.transport import Api


class Traffic:
    """Answers ``api`` received and their body bytes (a watch: one answer, its bytes not counted), from now on."""

    def __init__(self, api: Api) -> None:
        self.requests = 0
        self.received = 0
        self._lock = threading.Lock()
        pool = api.rest_client.pool_manager
        urlopen = pool.urlopen

        def counted(*args: Any, **kwargs: Any) -> Any:
            resp = urlopen(*args, **kwargs)
            with self._lock:
                self.requests += 1
                self.received += len(resp.data or b"") if kwargs.get("preload_content", True) else 0
            return resp

        pool.urlopen = counted  # type: ignore[method-assign]
