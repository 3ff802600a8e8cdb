"""A request with a body serialised beforehand, sent through an ``ApiClient``'s own transport.

Why: the gatekeeper sends one PATCH per released pod, thousands in a row, and on a 2-core node the generated
method spent more CPU than the request itself (issue 25: ~0.25 ms of ~0.5 ms per call went to argument
validation, ``sanitize_for_serialization`` of the body and headers, header negotiation and a ``json.dumps``
of a body that is already known). Here the body is bytes and the headers are built once; what makes the
request safe is not bypassed but reused:

* the transport is the client's own ``rest_client.pool_manager``: its TLS settings (CA, client certificate,
  verification, which ``client.load_configuration`` forces on), its proxy, its kept-alive connections (sized
  to the gatekeeper's concurrency) and its ``retries``. Without a proxy the request goes straight to the
  manager's connection pool for the API server (what ``PoolManager.urlopen`` does after parsing the URL and
  looking the pool up, which was another tenth of the CPU per request); through a proxy, via the manager;
* authentication goes through ``ApiClient.update_params_for_auth`` on every request, as the generated methods
  do, so a token refresh hook (in-cluster token rotation, exec plugins) still runs;
* the timeouts are the client's default (``TimeoutApiClient.default_timeout``) plus a deadline: the connect and
  read timeouts bound each socket operation, the deadline (their sum) the whole attempt;
* a non-2xx answer raises the client's own ``ApiException`` (status, reason, headers, body), so
  ``errors.api_call`` translates it exactly like a generated call's (``Retry-After`` of a 429 included).
"""

from __future__ import annotations

import threading
from typing import Any, Final
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.util import parse_url

from patcher.adapters.kube.client import DEFAULT_TIMEOUT

#: What the generated methods declare for the core API's token (the ``auth_settings`` they pass).
AUTH_SETTINGS: Final = ["BearerToken"]


class RawJson:
    """Send prepared JSON bodies through ``api``'s transport (see the module docstring). Thread-safe."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._host = str(api.configuration.host)
        self._safe = str(api.configuration.safe_chars_for_path_param or "")
        self._prefix = parse_url(self._host).path or ""  # a server URL with a path (behind a gateway)
        connect, read = getattr(api, "default_timeout", None) or DEFAULT_TIMEOUT
        self._timeout = urllib3.Timeout(connect=connect, read=read, total=connect + read)
        self._lock = threading.Lock()
        self._pool: tuple[object, urllib3.HTTPConnectionPool] | None = None

    def _direct_pool(self, manager: object) -> urllib3.HTTPConnectionPool | None:
        """The connection pool ``manager`` keeps for the API server (``None`` through a proxy, where the
        manager must build the request); looked up again once the client closed it."""
        if type(manager) is not urllib3.PoolManager:  # ProxyManager, SOCKSProxyManager: not direct
            return None
        with self._lock:
            cached = self._pool
            if cached is None or cached[0] is not manager or cached[1].pool is None:
                cached = self._pool = (manager, manager.connection_from_url(self._host))
            return cached[1]

    def path(self, template: str, **params: str) -> str:
        """``template`` with its ``{name}`` parameters quoted as the generated methods quote them."""
        return template.format(**{k: quote(v, safe=self._safe) for k, v in params.items()})

    def send(self, method: str, path: str, body: bytes, content_type: str) -> bytes:
        """The answer's body; raises ``ApiException`` for a non-2xx answer, urllib3/OS errors as they come
        (wrap the call in ``errors.api_call``)."""
        api: Any = self._api  # the generated client is untyped
        headers: dict[str, str] = {"Accept": "application/json", "Content-Type": content_type,
                                   **api.default_headers}
        if api.cookie:
            headers["Cookie"] = api.cookie
        api.update_params_for_auth(headers, [], AUTH_SETTINGS, path, method, None)
        manager = api.rest_client.pool_manager
        pool = self._direct_pool(manager)
        if pool is not None:  # as PoolManager.urlopen calls it, without the URL parsing and pool lookup
            resp = pool.urlopen(method, self._prefix + path, body=body, headers=headers, timeout=self._timeout,
                                preload_content=True, redirect=False, assert_same_host=False)
        else:
            resp = manager.urlopen(method, self._host + path, body=body, headers=headers, timeout=self._timeout,
                                   preload_content=True)
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        data: bytes = resp.data
        return data
