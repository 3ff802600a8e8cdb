"""Build the Kubernetes API client (``kube.transport.Api``): the credentials found the way kubectl finds them.

kubectl's order: ``--kubeconfig`` (one file, which must exist), else ``$KUBECONFIG`` (a colon-separated list,
merged; missing files skipped; for each name the first file that sets it wins), else ``~/.kube/config``, else
the in-cluster service account; ``--context`` as kubectl's.

TLS verification is forced on whatever the kubeconfig says: the agent edits a control-plane manifest as root
and must know whom it talks to. urllib3 retries once (stale keep-alive connections): the callers back off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from kubernetes.client.configuration import Configuration
from kubernetes.config import load_kube_config
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

from patcher.adapters.kube.errors import ApiError, api_json
from patcher.adapters.kube.transport import DEFAULT_TIMEOUT, Api
from patcher.core.errors import PatcherError
from patcher.core.fileread import read_file
from patcher.core.yamltext import YamlTextError, load_plain_all

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT", "Api", "ApiConfigError", "ClientSettings", "build_api_client", "kubeconfig_files",
           "load_configuration", "server_version"]

#: kubectl's default kubeconfig, below the home folder (the official client's ``KUBE_CONFIG_DEFAULT_LOCATION``
#: when ``$KUBECONFIG`` is unset; that constant is read once at import, this is looked up at each load).
HOME_KUBECONFIG = os.path.join(".kube", "config")
#: A kubeconfig larger than this is not one (kubectl's are a few KiB; embedded certificates a few more).
KUBECONFIG_LIMIT = 4 * 1024 * 1024
#: What the messages call the order the credentials are looked for in.
ORDER = "--kubeconfig, $KUBECONFIG, ~/.kube/config, then the in-cluster service account"


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


def kubeconfig_files(explicit: str | None, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """The kubeconfig files kubectl would read, in merge order, and what named them (``--kubeconfig``,
    ``$KUBECONFIG``, ``~/.kube/config``); no file: in-cluster. An explicit file that does not exist is an
    ``ApiConfigError`` (kubectl refuses it too); missing files of ``$KUBECONFIG`` are skipped, as kubectl does."""
    if explicit:
        if not os.path.isfile(explicit):
            raise ApiConfigError(f"cannot load the kubeconfig {explicit} (--kubeconfig): no such file")
        return [explicit], "--kubeconfig"
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [os.path.expanduser(p) for p in listed.split(os.pathsep) if p]
        return [p for p in dict.fromkeys(paths) if os.path.isfile(p)], "$KUBECONFIG"
    # no $HOME: the user database's, as kubectl's homedir (only for the process's own environment: a given one
    # without HOME has no home)
    home = environ.get("HOME") or (os.path.expanduser("~") if environ is os.environ else "")
    path = os.path.join(home, HOME_KUBECONFIG) if home else ""
    return ([path] if path and os.path.isfile(path) else []), "~/.kube/config"


def _contexts(files: list[str]) -> tuple[str | None, list[str]]:
    """The current context of a merged kubeconfig as kubectl takes it (the first file that sets one; the official
    client's merger lets the last one win, so it is passed on as the context) and every context's name."""
    current: str | None = None
    names: list[str] = []
    for path in files:
        try:  # within the limits of every YAML input, before the official loader parses it too
            docs = load_plain_all(read_file(path, "kubeconfig", limit=KUBECONFIG_LIMIT).decode("utf-8", "replace"))
        except YamlTextError as exc:
            raise ApiConfigError(f"cannot load the kubeconfig {path}: not YAML ({exc})") from None
        data = docs[0] if docs else None
        if not isinstance(data, dict):
            continue
        if current is None and isinstance(data.get("current-context"), str) and data["current-context"]:
            current = data["current-context"]
        for entry in data.get("contexts") or []:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
    return current, names


def load_configuration(
    settings: ClientSettings = ClientSettings(), environ: Mapping[str, str] | None = None
) -> Configuration:
    """Resolve the API configuration in kubectl's order (the module docstring); ``ApiConfigError`` with one
    sentence an operator can act on."""
    env = os.environ if environ is None else environ
    cfg = Configuration()
    files, named_by = kubeconfig_files(settings.kubeconfig, env)
    shown = os.pathsep.join(files)
    try:
        if files:
            current, names = _contexts(files)
            if settings.context and settings.context not in names:
                raise ApiConfigError(f"--context {settings.context}: no such context in the kubeconfig {shown} "
                                     f"({named_by}; its contexts: {', '.join(names) or 'none'})")
            context = settings.context or current
            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=shown, context=context, client_configuration=cfg, persist_config=False
            )
            source = f"kubeconfig {shown} ({named_by})"
        elif settings.context:
            raise ApiConfigError(f"--context {settings.context}: no kubeconfig found ({ORDER})")
        elif not env.get("KUBERNETES_SERVICE_HOST"):
            raise ApiConfigError(f"no Kubernetes credentials found: looked for {ORDER} (KUBERNETES_SERVICE_HOST "
                                 "is not set: not in a pod)")
        else:
            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=settings.token_file, cert_filename=settings.ca_file, environ=env
            )
            loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
            source = "in-cluster service account"
    except (ConfigException, PatcherError, OSError, ValueError, TypeError) as exc:
        where = f"kubeconfig {shown} ({named_by})" if files else "in-cluster configuration"
        detail = (exc.problem if isinstance(exc, PatcherError) else str(exc).splitlines()[0] if str(exc)
                  else type(exc).__name__)
        raise ApiConfigError(f"cannot load the {where}: {detail}") from exc
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
    """The API server's ``gitVersion`` (e.g. ``v1.31.2``), the fallback for the scheduler's version; ``None``
    when it cannot be asked right now (normal during a control-plane restart: logged, not raised)."""
    try:
        info = api_json("read the API server version", api.version)
    except ApiError as exc:
        log.info("%s", exc)
        return None
    version = info.get("gitVersion") if isinstance(info, dict) else None
    return version if isinstance(version, str) and version else None

