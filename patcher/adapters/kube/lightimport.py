"""Load the official Kubernetes client's transport without the rest of the package, and complete it on demand.

Why: reaching ``kubernetes.client.rest`` the normal way runs ``kubernetes/__init__.py`` and
``kubernetes/client/__init__.py`` first: every generated API class and pydantic model, most of the agent's
start time and memory (docs/benchmarks.md). The agent needs ``client.configuration``, ``client.rest``,
``client.exceptions`` and ``config.incluster_config``.

``install()`` registers the packages ``kubernetes``, ``kubernetes.client``, ``kubernetes.config`` and
``kubernetes.utils`` as ``_Package`` modules with the real spec and ``__path__`` but without having run their
``__init__.py``, so submodules import as usual. The first access to an attribute such a package lacks
(``kubernetes.client.CoreV1Api``) runs the real ``__init__.py`` into the same module object, once: every other
user sees the whole package, and the classes are the official ones. Nothing is done when ``kubernetes`` is
imported already.

The one place that relies on more than the client's public API (its package layout): ``make test-max`` runs its
tests against the newest ``kubernetes`` release instead of a cap in pyproject.toml.
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
