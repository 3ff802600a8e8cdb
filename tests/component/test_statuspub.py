"""The status publisher: when the agents' verdict ConfigMap is written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from patcher.adapters.kube.publish import StatusPublisher, StatusTarget
from patcher.adapters.kube.transport import Api
from tests.harness.emu.kubeemu import wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        yield e


def test_an_agent_publishes_the_verdict_when_it_starts_before_any_phase_change(emu: KubeEmulatorExt,
                                                                               api: Api) -> None:
    """An agent held back from its first write stays Pending from its start: no phase change ever kicks the
    publisher, and without a published verdict the admission policy gates nothing (its ConfigMap is missing).
    The real API server showed it (tests/real/test_real_scheduler.py); the start itself publishes."""
    emu.add_node("cp-1", labels={"node-role.kubernetes.io/control-plane": ""})
    publisher = StatusPublisher(api, StatusTarget(namespace="scheduler-patcher", prefix="scheduler-patcher.io/",
                                                  static_pod_name="kube-scheduler", mirror_namespace="kube-system",
                                                  compat_csi_baremetal=False, compat_namespace=None))
    publisher.start()
    try:
        assert wait_until(lambda: emu.get("configmaps", "scheduler-patcher-status", "scheduler-patcher") is not None,
                          10)
        cm = emu.get("configmaps", "scheduler-patcher-status", "scheduler-patcher")
        assert cm is not None and cm["data"]["ready"] == "false"
    finally:
        publisher.stop()
