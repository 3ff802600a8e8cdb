"""Build the Kubernetes API client the agent uses: in-cluster by default, a kubeconfig for local runs.

The client is ``kube.transport.Api``: the official client's ``Configuration`` and pool manager without its
generated classes. The in-cluster path imports only the official ``incluster_config`` loader (see
``kube.lightimport``); a kubeconfig loads the whole ``kubernetes.config`` package (YAML, OAuth, exec plugins),
which is for local runs.

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

from patcher.adapters.kube import lightimport
from patcher.adapters.kube.errors import ApiError, api_json
from patcher.adapters.kube.transport import DEFAULT_TIMEOUT, Api

lightimport.install()  # before the first kubernetes import (done by errors and transport already; said here too)

from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402
from kubernetes.config.incluster_config import (  # noqa: E402
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT", "Api", "ApiConfigError", "ClientSettings", "build_api_client", "load_configuration",
           "server_version"]


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


def load_configuration(
    settings: ClientSettings = ClientSettings(), environ: Mapping[str, str] | None = None
) -> Configuration:
    """Resolve the API configuration: explicit kubeconfig, else ``$KUBECONFIG``, else in-cluster.

    Raises ``ApiConfigError`` with one sentence an operator can act on.
    """
    env = os.environ if environ is None else environ
    cfg = Configuration()
    path = settings.kubeconfig or env.get("KUBECONFIG") or None
    try:
        if path:
            from kubernetes.config import load_kube_config  # the whole config package: YAML, OAuth, exec

            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=settings.context, client_configuration=cfg, persist_config=False
            )
            source = f"kubeconfig {path}"
        else:
            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=settings.token_file, cert_filename=settings.ca_file, environ=env
            )
            loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
            source = "in-cluster service account"
    except (ConfigException, OSError, ValueError, TypeError) as exc:
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
) -> Api:
    """An API client for ``settings`` (see ``load_configuration``); close it with ``.close()``."""
    return Api(load_configuration(settings, environ), settings.timeout)


def server_version(api: Api) -> str | None:
    """The API server's ``gitVersion`` (e.g. ``v1.31.2``), or ``None`` when it cannot be asked right now.

    Used as a fallback to learn the scheduler's version; an unreachable server is normal during a control-plane
    restart, so failures are logged and answered with ``None`` rather than raised.
    """
    try:
        info = api_json("read the API server version", api.version)
    except ApiError as exc:
        log.info("%s", exc)
        return None
    version = info.get("gitVersion") if isinstance(info, dict) else None
    return version if isinstance(version, str) and version else None

