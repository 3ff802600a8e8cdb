"""Build the Kubernetes API client the agent uses: in-cluster by default, a kubeconfig for local runs.

Every request gets a short default timeout (a hung API server must not stall a reconcile), urllib3's own
retries are limited to one (stale keep-alive connections) because the callers retry with backoff, TCP
keepalive is on so a dead watch connection is noticed, and TLS verification is forced on whatever the
kubeconfig says: the agent edits a control-plane manifest as root and must know whom it talks to.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

from patcher.adapters.kube.errors import ApiError, api_json

log = logging.getLogger(__name__)

#: (connect, read) seconds for ordinary requests.
DEFAULT_TIMEOUT: tuple[float, float] = (5.0, 10.0)


class ApiConfigError(Exception):
    """No usable API configuration (missing in-cluster environment, unreadable kubeconfig, …)."""


@dataclass(frozen=True)
class ClientSettings:
    """Where the configuration comes from. Empty fields mean "decide from the environment"."""

    kubeconfig: str | None = None
    context: str | None = None
    timeout: tuple[float, float] = DEFAULT_TIMEOUT
    #: Kept-alive connections per host (``None``: the client's default, five per CPU). A pool of N concurrent
    #: writers needs at least N, or urllib3 opens and drops a connection per request beyond them.
    pool_size: int | None = None
    #: Only for tests of the in-cluster path; production uses the service-account files.
    token_file: str = SERVICE_TOKEN_FILENAME
    ca_file: str = SERVICE_CERT_FILENAME


class TimeoutApiClient(k8s.ApiClient):
    """An ``ApiClient`` that applies a default ``_request_timeout`` to every call that does not set one.

    ``call_api`` is the single funnel of every generated API method, so overriding it covers calls made by
    code that does not know about timeouts (the agent loop, later features) as well as ours.
    """

    def __init__(self, configuration: k8s.Configuration, timeout: tuple[float, float]) -> None:
        super().__init__(configuration)
        self.default_timeout = timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.default_timeout
        return super().call_api(*args, **kwargs)

    def close(self) -> None:
        """Close the connection pool (typed here: the generated base class is not)."""
        super().close()  # type: ignore[no-untyped-call]


def load_configuration(
    settings: ClientSettings = ClientSettings(), environ: Mapping[str, str] | None = None
) -> k8s.Configuration:
    """Resolve the API configuration: explicit kubeconfig, else ``$KUBECONFIG``, else in-cluster.

    Raises ``ApiConfigError`` with one sentence an operator can act on.
    """
    env = os.environ if environ is None else environ
    cfg = k8s.Configuration()
    path = settings.kubeconfig or env.get("KUBECONFIG") or None
    try:
        if path:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=settings.context, client_configuration=cfg, persist_config=False
            )
            source = f"kubeconfig {path}"
        else:
            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=settings.token_file, cert_filename=settings.ca_file, environ=env
            )
            loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
            source = "in-cluster service account"
    except (k8s_config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = f"kubeconfig {path}" if path else "in-cluster configuration"
        raise ApiConfigError(f"cannot load the {where}: {exc}") from exc
    if not cfg.verify_ssl:
        log.warning("%s asks to skip TLS verification; ignored, verification stays on", source)
        cfg.verify_ssl = True
    cfg.retries = 1
    cfg.keep_alive = True
    if settings.pool_size is not None:
        cfg.connection_pool_maxsize = settings.pool_size
    log.debug("kubernetes API at %s from %s", cfg.host, source)
    return cfg


def build_api_client(
    settings: ClientSettings = ClientSettings(), environ: Mapping[str, str] | None = None
) -> TimeoutApiClient:
    """An API client for ``settings`` (see ``load_configuration``); close it with ``.close()``."""
    return TimeoutApiClient(load_configuration(settings, environ), settings.timeout)


def server_version(api: k8s.ApiClient) -> str | None:
    """The API server's ``gitVersion`` (e.g. ``v1.31.2``), or ``None`` when it cannot be asked right now.

    Used as a fallback to learn the scheduler's version; an unreachable server is normal during a control-plane
    restart, so failures are logged and answered with ``None`` rather than raised.
    """
    try:
        # Raw JSON: the generated model insists on every field (goVersion, compiler, …) being present.
        info = api_json("read the API server version", k8s.VersionApi(api).get_code)
    except ApiError as exc:
        log.info("%s", exc)
        return None
    version = info.get("gitVersion") if isinstance(info, dict) else None
    return version if isinstance(version, str) and version else None

