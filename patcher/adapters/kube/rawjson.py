"""A request with a body serialised beforehand, sent through an ``ApiClient``'s own transport.

Why: the gatekeeper sends one PATCH per released pod, thousands in a row, and on a 2-core node the generated
method spent more CPU than the request itself (issue 25: ~0.25 ms of ~0.5 ms per call went to argument
validation, ``sanitize_for_serialization`` of the body and headers, header negotiation and a ``json.dumps``
of a body that is already known). Here the body is bytes and the headers are built once; what makes the
request safe is not bypassed but reused:

* the transport is the client's own ``rest_client.pool_manager``: its TLS settings (CA, client certificate,
  verification, which ``client.load_configuration`` forces on), its proxy, its kept-alive connections (sized
  to the gatekeeper's concurrency) and its ``retries``;
* authentication goes through ``ApiClient.update_params_for_auth`` on every request, as the generated methods
  do, so a token refresh hook (in-cluster token rotation, exec plugins) still runs;
* the timeouts are the client's default (``TimeoutApiClient.default_timeout``) plus a deadline: the connect and
  read timeouts bound each socket operation, the deadline (their sum) the whole attempt;
* a non-2xx answer raises the client's own ``ApiException`` (status, reason, headers, body), so
  ``errors.api_call`` translates it exactly like a generated call's (``Retry-After`` of a 429 included).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from patcher.adapters.kube.client import DEFAULT_TIMEOUT

#: What the generated methods declare for the core API's token (the ``auth_settings`` they pass).
AUTH_SETTINGS: Final = ["BearerToken"]


class RawJson:
    """Send prepared JSON bodies through ``api``'s transport (see the module docstring). Thread-safe."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._host = str(api.configuration.host)
        self._safe = str(api.configuration.safe_chars_for_path_param or "")
        connect, read = getattr(api, "default_timeout", None) or DEFAULT_TIMEOUT
        self._timeout = urllib3.Timeout(connect=connect, read=read, total=connect + read)

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
        resp = api.rest_client.pool_manager.urlopen(method, self._host + path, body=body, headers=headers,
                                                    timeout=self._timeout, preload_content=True)
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        data: bytes = resp.data
        return data
