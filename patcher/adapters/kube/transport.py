"""The one request path to the API server: the official client's configuration and pool manager, JSON in and out.

Not the generated client: ``ApiClient`` imports pydantic and every model, validates and serialises on every
request (CPU the gatekeeper pays per pod) and its models refuse answers that lack fields servers omit
(docs/benchmarks.md). What makes a request safe is reused from the official client: the ``Configuration``
from its loaders (``kube.client``, TLS verification forced on), its ``rest.RESTClientObject(...).pool_manager``
(CA, client certificate, ``tls_server_name``, proxy, keepalive, pool size, one urllib3 retry: callers back
off), ``configuration.auth_settings()`` on every request (so a token refresh hook runs), a timeout on every
request, and its ``ApiException`` for a non-2xx answer, translated by ``errors.api_call``.

``Resource`` names what is requested: the RBAC scan of every command's modules reads the verbs (``api.get(NODES,
...``) and the resources from here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import quote, urlencode

import urllib3
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTClientObject

Obj = dict[str, Any]
#: A request's timeout: seconds for the whole request, or (connect, read).
Timeout = float | tuple[float, float]

#: (connect, read) seconds for ordinary requests.
DEFAULT_TIMEOUT: tuple[float, float] = (5.0, 10.0)
JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
USER_AGENT: Final = "scheduler-patcher"
#: Only the metadata of each object (``PartialObjectMetadata``), as client-go's metadata informers ask for it; a
#: server that cannot answer so sends the whole objects (the plain JSON fallback), which carry it too.
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_WATCH: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


@dataclass(frozen=True)
class Resource:
    """A resource type of the API: ``/api/v1/nodes``, ``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases``."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The collection (``name`` None) or object path; ``namespace`` None: across all namespaces."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are not namespaced")
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return base if name is None else f"{base}/{quote(name, safe='')}"


NODES: Final = Resource("", "v1", "nodes", namespaced=False)
PODS: Final = Resource("", "v1", "pods")
PODTEMPLATES: Final = Resource("", "v1", "podtemplates")
EVENTS: Final = Resource("", "v1", "events")
CONFIGMAPS: Final = Resource("", "v1", "configmaps")
DAEMONSETS: Final = Resource("apps", "v1", "daemonsets")
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases")


class Api:
    """Requests to one API server with one ``Configuration`` (see the module docstring). Thread-safe.

    The verbs (``get``, ``list``, ``create``, ``patch``, ``update``, ``watch``) return the decoded answer (a
    watch: the open response) and raise what the transport raises: ``ApiException``, urllib3 errors,
    ``OSError``, ``ValueError`` for an undecodable body. Wrap them in ``errors.api_call``.
    """

    def __init__(self, configuration: Configuration, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self.configuration = configuration
        self.default_timeout = timeout
        self.rest_client = RESTClientObject(configuration)
        self.host = str(configuration.host).rstrip("/")
        self.default_headers: dict[str, str] = {"Accept": JSON, "User-Agent": USER_AGENT}

    # -- the request path ---------------------------------------------------------------------------------

    def _timeout(self, timeout: Timeout | None, stream: bool) -> urllib3.Timeout:
        given = self.default_timeout if timeout is None else timeout
        if isinstance(given, tuple):
            connect, read = given
            return urllib3.Timeout(connect=connect, read=read) if stream else \
                urllib3.Timeout(connect=connect, read=read, total=connect + read)
        return urllib3.Timeout(total=given)

    def headers(self, content_type: str | None = None, accept: str | None = None) -> dict[str, str]:
        """The headers of one request: ours, the content type, and the credentials as of now."""
        headers = dict(self.default_headers)
        if accept:
            headers["Accept"] = accept
        if content_type:
            headers["Content-Type"] = content_type
        settings: Any = self.configuration.auth_settings()  # runs the refresh hook, if any
        for setting in settings.values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"])] = str(setting["value"])
        return headers

    def request(self, method: str, path: str, *, query: Mapping[str, object] | None = None,
                body: bytes | None = None, content_type: str | None = None, timeout: Timeout | None = None,
                stream: bool = False, accept: str | None = None) -> Any:
        """The urllib3 response to one request (body read unless ``stream``); ``ApiException`` for non-2xx."""
        params = {k: ("true" if v else "false") if isinstance(v, bool) else str(v)
                  for k, v in (query or {}).items() if v is not None}
        target = path + ("?" + urlencode(params) if params else "")
        headers = self.headers(content_type if body is not None else None, accept)
        # The API server does not redirect; following one would carry the credentials elsewhere.
        resp = self.rest_client.pool_manager.urlopen(
            method, self.host + target, body=body, headers=headers, timeout=self._timeout(timeout, stream),
            preload_content=not stream, redirect=False)
        if not 200 <= resp.status <= 299:
            if stream:
                resp.read()  # the error's body, for the exception; then the connection goes back
                resp.release_conn()
            raise ApiException(http_resp=resp)
        return resp

    def send(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None, *,
             timeout: Timeout | None = None) -> bytes:
        """A prepared body (serialised by a caller that sends thousands); the answer's body, undecoded."""
        return cast(bytes, self.request(method, path, body=body, content_type=content_type, timeout=timeout).data)

    def call(self, method: str, path: str, *, query: Mapping[str, object] | None = None, body: object = None,
             content_type: str = JSON, timeout: Timeout | None = None, accept: str | None = None) -> Any:
        """One request with a JSON body (``None``: none) and a JSON answer, decoded."""
        raw = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        return json.loads(self.request(method, path, query=query, body=raw, content_type=content_type,
                                       timeout=timeout, accept=accept).data)

    # -- the verbs ------------------------------------------------------------------------------------------

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            timeout: Timeout | None = None) -> Any:
        return self.call("GET", resource.path(namespace, name), timeout=timeout)

    def list(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None, continue_: str | None = None,
             timeout: Timeout | None = None, accept: str | None = None) -> Any:
        """A list; ``accept=METADATA_LIST`` asks for the objects' metadata only."""
        query = {"labelSelector": label_selector, "fieldSelector": field_selector, "limit": limit,
                 "continue": continue_}
        return self.call("GET", resource.path(namespace), query=query, timeout=timeout, accept=accept)

    def create(self, resource: Resource, body: Obj, *, namespace: str | None = None,
               timeout: Timeout | None = None) -> Any:
        return self.call("POST", resource.path(namespace), body=body, timeout=timeout)

    def update(self, resource: Resource, name: str, body: Obj, *, namespace: str | None = None,
               timeout: Timeout | None = None) -> Any:
        return self.call("PUT", resource.path(namespace, name), body=body, timeout=timeout)

    def patch(self, resource: Resource, name: str, body: object, *, content_type: str,
              namespace: str | None = None, timeout: Timeout | None = None) -> Any:
        return self.call("PATCH", resource.path(namespace, name), body=body, content_type=content_type,
                         timeout=timeout)

    def delete(self, resource: Resource, name: str, body: Obj | None = None, *, namespace: str | None = None,
               timeout: Timeout | None = None) -> Any:
        """``body``: the ``DeleteOptions`` (e.g. ``propagationPolicy``); the answer is the object as the server
        left it (still there, marked, while finalizers hold it) or a ``Status``."""
        return self.call("DELETE", resource.path(namespace, name), body=body, timeout=timeout)

    def watch(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, resource_version: str | None = None,
              timeout_seconds: int, connect_timeout: float, accept: str | None = None) -> Any:
        """An open watch stream (a urllib3 response; read it with ``.stream()``, then ``.release_conn()``). The
        read timeout is the server's ``timeoutSeconds`` plus 30 s: a silent connection is noticed, and the
        server ends a healthy stream first."""
        query = {"watch": True, "resourceVersion": resource_version, "allowWatchBookmarks": True,
                 "timeoutSeconds": timeout_seconds, "labelSelector": label_selector,
                 "fieldSelector": field_selector}
        return self.request("GET", resource.path(namespace), query=query, stream=True,
                            timeout=(connect_timeout, float(timeout_seconds + 30)), accept=accept)

    def version(self, *, timeout: Timeout | None = None) -> Any:
        """``GET /version/`` (the generated ``VersionApi``'s path): the server's ``gitVersion`` and build facts."""
        return self.call("GET", "/version/", timeout=timeout)

    def close(self) -> None:
        self.rest_client.close()
