"""One error hierarchy for the Kubernetes API, by HTTP status, in the manner of kopf's errors.

Every adapter that calls the API turns the client library's many failure kinds (``ApiException`` with a
status, urllib3 transport errors, ``OSError`` from the socket, ``ValueError`` from an undecodable body) into
one of these, through ``translate``/``api_call``/``api_json`` here, so callers above the adapters catch
``ApiError`` or the one subclass they handle (``NotFound``, ``Conflict``, ...) and never import the client.
The message names what was being done: ``cannot read ConfigMap ns/name: HTTP 404 Not Found``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3

from patcher.adapters.kube import lightimport

lightimport.install()  # before the first kubernetes import: see kube.lightimport

from kubernetes.client.exceptions import ApiException  # noqa: E402

#: Everything a call to the API server can raise: an HTTP error answer, a transport failure (refused, reset,
#: timeout, TLS) or an undecodable body. Only ``api_call`` catches it: every adapter translates through there,
#: once, at the boundary, and everything else catches ``ApiError`` and its subclasses.
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


class ApiError(Exception):
    """A request to the API server failed. ``status`` is the HTTP code (``None``: no answer), ``what`` the deed.

    ``detail`` alone (``HTTP 503 Service Unavailable``) is for a log line that already names the deed.
    """

    def __init__(self, what: str, detail: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(f"cannot {what}: {detail}")
        self.what = what
        self.detail = detail
        self.status = status
        self.reason = reason


class Unreachable(ApiError):
    """No HTTP answer: refused, reset, timed out, TLS failure, or a body that does not decode."""


class Unauthorized(ApiError):
    """401: the credentials were not accepted (an expired or revoked token)."""


class Forbidden(ApiError):
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

    def __init__(self, what: str, detail: str, status: int | None = 429, reason: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(what, detail, status, reason)
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
    """One short line for an API failure (the client's own messages span lines and dump headers)."""
    if isinstance(exc, ApiError):
        return str(exc)
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def error_status(exc: BaseException) -> int | None:
    """The HTTP status of an API error, ``None`` for transport errors (refused, reset, timeout)."""
    if isinstance(exc, ApiError):
        return exc.status
    return exc.status if isinstance(exc, ApiException) and isinstance(exc.status, int) else None


def translate(exc: BaseException, what: str) -> ApiError:
    """The ``ApiError`` subclass for a client library failure while doing ``what`` (``read pod ns/name``)."""
    if isinstance(exc, ApiError):
        return exc
    status = error_status(exc)
    reason = str(exc.reason or "") if isinstance(exc, ApiException) else type(exc).__name__
    if status == 429:
        headers = getattr(exc, "headers", None)
        return TooManyRequests(what, describe_error(exc), status, reason,
                               retry_after_seconds(headers.get("Retry-After") if headers is not None else None))
    return error_class(status)(what, describe_error(exc), status, reason)


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
