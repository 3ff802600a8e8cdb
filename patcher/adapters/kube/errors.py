"""One error hierarchy for the Kubernetes API, by HTTP status, in the manner of kopf's errors.

Every adapter turns the client library's failures (``ApiException``, urllib3 errors, ``OSError``, an
undecodable body) into one of these through ``api_call``/``api_json``, so callers above the adapters catch
``ApiError`` or the one subclass they handle and never import the client. The message names the deed:
``cannot read ConfigMap ns/name: HTTP 404 Not Found``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

#: Everything a call to the API server can raise: an HTTP error answer, a transport failure (refused, reset,
#: timeout, TLS) or an undecodable body. Only ``api_call`` catches it: every adapter translates through there,
#: once, at the boundary, and everything else catches ``ApiError`` and its subclasses.
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


class ApiError(Exception):
    """A request to the API server failed. ``status`` is the HTTP code (``None``: no answer), ``what`` the deed.

    ``detail`` alone (``HTTP 503 Service Unavailable``) is for a log line that already names the deed.
    """

    def __init__(self, what: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"cannot {what}: {detail}")
        self.detail = detail
        self.status = status


class Unreachable(ApiError):
    """No HTTP answer: refused, reset, timed out, TLS failure, or a body that does not decode."""


class Denied(ApiError):
    """401 or 403: retrying soon heals it only right after an API server start (``backoff.DENIED_QUICK_RETRIES``);
    past that, the Role or the token must change first."""


class Unauthorized(Denied):
    """401: the credentials were not accepted (an expired or revoked token)."""


class Forbidden(Denied):
    """403: RBAC does not allow it; retrying will not help until the Role changes."""


class NotFound(ApiError):
    """404: the object (or the resource) does not exist."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists; read again and rebuild the write."""


class Invalid(ApiError):
    """422: the server refused the body (also a JSON patch whose ``test`` op failed: the object changed)."""


class TooManyRequests(ApiError):
    """429: the API server sheds load (API Priority and Fairness rejects a request its queues cannot hold, and
    the ``max-requests-inflight`` limits answer the same way). ``retry_after`` is the server's
    ``Retry-After`` in seconds (``None`` when absent): a client must wait that long before its next request."""

    def __init__(self, what: str, detail: str, status: int | None = 429, retry_after: float | None = None) -> None:
        super().__init__(what, detail, status)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx: the API server (or what is behind it) failed; transient, retry with backoff."""


_BY_STATUS: dict[int, type[ApiError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                                          422: Invalid, 429: TooManyRequests}


def error_class(status: int | None) -> type[ApiError]:
    """The class for an HTTP status: the table above, 5xx ``ServerError``, no status ``Unreachable``."""
    if status is None:
        return Unreachable
    if 500 <= status <= 599:
        return ServerError
    return _BY_STATUS.get(status, ApiError)


def describe_error(exc: BaseException) -> str:
    """One short line for an API failure (the client's own messages span lines and dump headers): for no
    answer, ``cannot reach https://10.0.0.1:6443: connection refused`` instead of urllib3's ``MaxRetryError``
    with its pool, URL and nested cause."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    why = _no_answer(exc)
    if why is not None:
        where = _endpoint(exc)
        return f"cannot reach {where}: {why}" if where else why
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it: urllib3's ``reason`` (a ``MaxRetryError``'s last failure), then the
    ``__cause__``/``__context__`` links, each once."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is f for f in found):
            continue
        found.append(e)
        reason = getattr(e, "reason", None)
        todo += [reason if isinstance(reason, BaseException) else None, e.__cause__, e.__context__]
    return found


def _endpoint(exc: BaseException) -> str | None:
    """``https://host:port`` of the connection that failed (urllib3 errors carry their pool or connection)."""
    for e in _chain(exc):
        holder = getattr(e, "pool", None) or getattr(e, "conn", None)
        host, port = getattr(holder, "host", None), getattr(holder, "port", None)
        if isinstance(host, str) and host:
            scheme = getattr(holder, "scheme", None) or ("https" if "HTTPS" in type(holder).__name__ else "http")
            shown = f"[{host}]" if ":" in host else host
            return f"{scheme}://{shown}" + (f":{port}" if port else "")
    return None


#: Why no answer came, by the first kind found in the failure's chain, in this order (``None``: the TLS error's).
_NO_ANSWER: tuple[tuple[tuple[type[BaseException], ...], str | None], ...] = (
    ((ConnectionRefusedError,), "connection refused"),
    ((socket.gaierror, urllib3.exceptions.NameResolutionError), "cannot resolve the host name"),
    ((ssl.SSLError,), None),
    ((urllib3.exceptions.ConnectTimeoutError,), "no connection within the timeout"),
    ((urllib3.exceptions.ReadTimeoutError, TimeoutError), "no answer within the timeout"),
    ((ConnectionResetError, ConnectionAbortedError, BrokenPipeError, urllib3.exceptions.ProtocolError),
     "the connection was closed without an answer"),
    ((urllib3.exceptions.ProxyError,), "the proxy failed"),
)


def _no_answer(exc: BaseException) -> str | None:
    """Why no answer came, in a few words (``connection refused``, ``TLS: certificate verify failed: …``);
    ``None`` when ``exc`` is not a transport failure."""
    chain = _chain(exc)
    if not any(isinstance(e, urllib3.exceptions.HTTPError | OSError) for e in chain):
        return None
    for kinds, why in _NO_ANSWER:
        if (found := next((e for e in chain if isinstance(e, kinds)), None)) is not None:
            tls = getattr(found, "verify_message", None) or getattr(found, "reason", None) or found
            return why or f"TLS: {tls}".splitlines()[0]
    os_error = next((e for e in chain if isinstance(e, OSError) and e.strerror), None)
    if isinstance(os_error, OSError):
        return str(os_error.strerror).lower()
    return f"{type(chain[-1]).__name__}: {chain[-1]}".splitlines()[0][:200]


def translate(exc: BaseException, what: str) -> ApiError:
    """The ``ApiError`` subclass for a client library failure while doing ``what`` (``read pod ns/name``)."""
    if isinstance(exc, ApiError):
        return exc
    # the HTTP status; None for a transport failure (refused, reset, timeout)
    status = exc.status if isinstance(exc, ApiException) and isinstance(exc.status, int) else None
    if status == 429:
        headers = getattr(exc, "headers", None)
        return TooManyRequests(what, describe_error(exc), status,
                               retry_after_seconds(headers.get("Retry-After") if headers is not None else None))
    return error_class(status)(what, describe_error(exc), status)


def retry_after_seconds(value: object) -> float | None:
    """A ``Retry-After`` header in seconds. The API server sends whole seconds; an HTTP date (allowed by RFC
    9110, never sent by kube-apiserver) or garbage counts as absent, and so does a negative number."""
    try:
        seconds = float(str(value).strip()) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


@contextmanager
def api_call(what: str) -> Iterator[None]:
    """Run the block's API calls; any client failure leaves it as the matching ``ApiError``."""
    try:
        yield
    except API_ERRORS as exc:
        raise translate(exc, what) from exc


def api_json(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (a verb of ``kube.transport.Api``: the decoded JSON answer), its failures
    translated as ``api_call`` does."""
    with api_call(what):
        return fn(*args, **kwargs)
