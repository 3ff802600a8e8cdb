"""The API-emulator fixtures many component test files used to copy: a bare emulator and a client of it.

A test module imports them by name (``from tests.harness.emu.fixtures import api as api, emu as emu``), as
``tests/harness/helpers.py``'s ``node``; a module whose emulator needs objects from the start keeps its own
``emu``. The ``kubeconfig`` fixture of ``tests/conftest.py`` points at whichever ``emu`` the module uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.transport import Api
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

__all__ = ["api", "emu"]

#: Connect and read timeouts of the test client: a second of read leaves room for a busy machine, the connect
#: half fails fast when a test stopped the emulator on purpose.
TIMEOUT = (0.5, 2.0)


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    """An empty emulator with its fault hooks (the test adds the Nodes and pods it needs)."""
    with KubeEmulatorExt() as e:
        yield e


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[Api]:
    """A client of the module's ``emu``, through the kubeconfig a user would give."""
    client = build_api_client(ClientSettings(kubeconfig=str(kubeconfig), timeout=TIMEOUT))
    yield client
    client.close()
