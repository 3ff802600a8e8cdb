"""Load the official Kubernetes client's transport without the rest of the package, and complete it on demand.

Why: ``import kubernetes.client`` runs the package files ``kubernetes/__init__.py`` (which imports ``client``,
``config``, ``dynamic``, ``watch``, ``stream``, ``utils``, ``leaderelection`` and ``informer``) and
``kubernetes/client/__init__.py`` (every generated API class and all its pydantic models): hundreds of modules, a
large share of the agent's start time and memory (figures in docs/benchmarks.md). The agent needs four modules of
it: ``client.configuration`` (the ``Configuration``), ``client.rest`` (the pool manager with the TLS, CA, client
certificate and proxy settings), ``client.exceptions`` (``ApiException``) and ``config.incluster_config`` (the
service-account loader with its token refresh). Python imports a submodule only after its parent packages, so
reaching those four through the normal import runs the three package files first.

``install()`` registers the packages ``kubernetes``, ``kubernetes.client``, ``kubernetes.config`` and
``kubernetes.utils`` (the latter two are imported by ``rest`` and ``incluster_config``) as module objects that
carry the real spec and ``__path__`` but have not run their ``__init__.py`` yet, so submodules import as usual
from the installed package. They are ``_Package`` modules: the first access to an attribute they do not have
(``kubernetes.client.CoreV1Api``, ``kubernetes.config.load_kube_config``, ``kubernetes.watch``) runs the real
``__init__.py`` into that same module object, once, so every other user of the package (the gatekeeper's and
the readiness command's tests, the kubeconfig loader, a script) sees the whole package as if it had been
imported normally; only the cost moves to the first use. The submodules the agent imports are real modules,
so the classes are the official ones (``isinstance`` and ``except ApiException`` work across both ways in).

Nothing is done when ``kubernetes`` is already imported (fully or by an earlier ``install``), so the order in
which a process imports things does not matter.

This is the one place that relies on more than the client's public API (its package layout and which names its
submodules import from their parents): without it, the agent's start with the API misses its time bound
(docs/benchmarks.md). ``make test-max`` runs its tests against the newest ``kubernetes`` release instead of a
cap in pyproject.toml.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

#: The package modules registered without running their ``__init__.py``, parents first.
PACKAGES = ("kubernetes", "kubernetes.client", "kubernetes.config", "kubernetes.utils")
#: The submodules the agent's API path needs; ``install`` imports them.
SUBMODULES = ("kubernetes.client.exceptions", "kubernetes.client.configuration", "kubernetes.client.rest",
              "kubernetes.config.config_exception", "kubernetes.config.incluster_config")
#: Attributes a submodule takes from a light package by ``from kubernetes.client import Configuration``: set
#: on the package at once, so that import does not complete the package. (package, attribute, module)
PRESET = (("kubernetes.client", "Configuration", "kubernetes.client.configuration"),
          ("kubernetes.client", "ApiException", "kubernetes.client.exceptions"),
          ("kubernetes.config", "ConfigException", "kubernetes.config.config_exception"))
#: Dunder names that complete the package (they are part of what its ``__init__.py`` defines); any other
#: dunder lookup (``__wrapped__``, ``__file__`` probes of inspect, pytest, copy) must not.
_PUBLIC_DUNDERS = frozenset({"__all__", "__version__", "__project__"})

_lock = threading.RLock()


class _Package(types.ModuleType):
    """A package whose ``__init__.py`` runs on the first missing attribute (see the module docstring)."""

    _light_state: str  # "light", "completing" or "complete"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in _PUBLIC_DUNDERS:
            raise AttributeError(name)
        if complete(self):
            return getattr(self, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


def complete(module: types.ModuleType) -> bool:
    """Run the real ``__init__.py`` of a light package into ``module``; True when it ran now.

    False when it had run already, or is running in this thread (a name the package file has not defined
    yet: the ``AttributeError`` a partly imported module gives, so ``from x import y`` falls back to the
    submodule ``x.y`` as it would in a normal import). Another thread waits until it has run.
    """
    with _lock:
        if getattr(module, "_light_state", "complete") != "light":
            return False
        module._light_state = "completing"  # type: ignore[attr-defined]
        try:
            spec = module.__spec__
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(module)
        except BaseException:
            module._light_state = "light"  # type: ignore[attr-defined]
            raise
        module._light_state = "complete"  # type: ignore[attr-defined]
        return True


def is_light(name: str) -> bool:
    """Whether package ``name`` is loaded and has not run its ``__init__.py`` (yet)."""
    module = sys.modules.get(name)
    return module is not None and getattr(module, "_light_state", "complete") == "light"


def install() -> bool:
    """Register the light packages and import ``SUBMODULES``; False (nothing done) when ``kubernetes`` is
    already imported. Thread-safe; call it before the first ``kubernetes`` import of a module."""
    with _lock:
        if "kubernetes" in sys.modules:
            return False
        registered: list[str] = []
        try:
            for name in PACKAGES:
                parent, _, child = name.rpartition(".")
                path = sys.modules[parent].__path__ if parent else None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                    raise ImportError(f"no package {name}", name=name)
                module = _Package(name)
                module.__spec__ = spec
                module.__loader__ = spec.loader
                module.__file__ = spec.origin
                module.__path__ = list(spec.submodule_search_locations)
                module.__package__ = name
                module._light_state = "light"
                sys.modules[name] = module
                registered.append(name)
                if parent:
                    setattr(sys.modules[parent], child, module)
            for name in SUBMODULES:
                importlib.import_module(name)
                for package, attribute, source in PRESET:  # before a later submodule imports it from there
                    if source == name:
                        setattr(sys.modules[package], attribute, getattr(sys.modules[source], attribute))
        except BaseException:
            for name in registered:  # leave the normal import to do its work
                sys.modules.pop(name, None)
            for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
                del sys.modules[name]
            raise
        return True
