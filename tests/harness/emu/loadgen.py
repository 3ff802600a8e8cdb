"""A bounded burst of HTTP GETs against one port, from a pool of client threads (used by tests and bench/).

Raw sockets instead of urllib: each request is one connect, one request line, one read until the server
closes, which is what a kubelet probe does, and the outcome of each is kept (status, or why it failed) so
the caller can count instead of timing.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


@dataclass
class Burst:
    outcomes: Counter[str] = field(default_factory=Counter)  # "200", "503", "timeout", "refused", "reset", ...
    latencies_ms: list[float] = field(default_factory=list)  # of the requests answered


def get_once(host: str, port: int, path: str, timeout: float) -> tuple[str, float]:
    """(outcome, milliseconds): the HTTP status code, or the kind of failure."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except TimeoutError:
        return "timeout", 0.0
    except ConnectionRefusedError:
        return "refused", 0.0
    except ConnectionError:
        return "reset", 0.0
    parts = data.split(b" ", 2)
    status = parts[1].decode() if len(parts) > 2 and data.startswith(b"HTTP/") else "garbled"
    return status, (time.perf_counter() - t0) * 1000


def burst(host: str, port: int, *, requests: int, concurrency: int, timeout: float,
          paths: tuple[str, ...] = ("/healthz", "/readyz", "/metrics")) -> Burst:
    """``requests`` GETs, ``concurrency`` at a time; returns when every one has an outcome."""
    result = Burst()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for outcome, ms in pool.map(lambda i: get_once(host, port, paths[i % len(paths)], timeout),
                                    range(requests)):
            result.outcomes[outcome] += 1
            if ms:
                result.latencies_ms.append(ms)
    return result
