"""OwnerWatcher against the emulator: own pod -> ownerReference -> one DaemonSet watched by name; what a stop
reads (``view``) and the short read at the stop (``confirm``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.owner import OwnerWatcher, owner_daemonset
from patcher.adapters.kube.transport import Api
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

NS, DS, POD, NODE = "scheduler-patcher", "scheduler-patcher", "scheduler-patcher-x1", "cp-1"
CP = "node-role.kubernetes.io/control-plane"
DAEMONSETS = f"/apis/apps/v1/namespaces/{NS}/daemonsets"


def daemonset(node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DS, "namespace": NS},
            "spec": {"template": {"spec": {"nodeSelector": node_selector or {CP: ""}, "hostNetwork": True,
                                           "tolerations": [{"key": CP, "operator": "Exists"}]}}}}


def pod(owner: str | None = DS) -> dict[str, Any]:
    refs = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "controller": True, "uid": "u"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": NS, "ownerReferences": refs if owner else []},
            "spec": {"nodeName": NODE}}


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        e.add_node(NODE, labels={CP: ""})
        yield e


@pytest.fixture
def changes() -> threading.Event:
    return threading.Event()


@pytest.fixture
def owner(api: Api, changes: threading.Event) -> Iterator[OwnerWatcher]:
    w = OwnerWatcher(api, NS, POD, NODE, on_update=changes.set, backoff=Backoff(0.05, 0.2), watch_timeout_s=30)
    yield w
    w.stop()


def test_the_owner_is_the_daemonset_among_the_owner_references() -> None:
    assert owner_daemonset(pod()) == DS
    assert owner_daemonset(pod(None)) is None
    other = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE},
                                              {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x"}]}}
    assert owner_daemonset(other) == "x"


def test_a_selecting_daemonset_is_known_and_kept_watching_by_name(emu: KubeEmulator, owner: OwnerWatcher,
                                                                  changes: threading.Event) -> None:
    emu.create(daemonset())
    emu.create(pod())
    assert not owner.view().known  # nothing read yet: a stop now restores
    owner.start()
    assert wait_until(lambda: owner.view().known, 10), owner.view()
    view = owner.view()
    assert view.successor() == f"DaemonSet {DS} still selects this node" and changes.is_set()
    watches = [r.query for r in emu.requests("GET", DAEMONSETS) if r.query.get("watch") == "true"]
    assert watches and all(q.get("fieldSelector") == f"metadata.name={DS}" for q in watches)

    changes.clear()  # foreground deletion: the deletionTimestamp comes by the watch
    emu.mutate("daemonsets", DS, lambda d: d["metadata"].update(deletionTimestamp="2026-11-25T09:00:00Z"), NS,
               "apps")
    assert wait_until(lambda: owner.view().deleting, 10)
    assert owner.view().successor() is None and owner.view().gone() == f"DaemonSet {DS} is being deleted"
    emu.delete("daemonsets", DS, NS, "apps")
    assert wait_until(lambda: not owner.view().exists, 10)
    assert owner.view().known and owner.view().gone() == f"DaemonSet {DS} is gone"


def test_confirm_reads_the_node_again(emu: KubeEmulator, owner: OwnerWatcher) -> None:
    """A label taken off the Node has no watch here: the stop's short read sees it."""
    emu.create(daemonset())
    emu.create(pod())
    owner.start()
    assert wait_until(lambda: owner.view().selects, 10), owner.view()
    def unlabel(node: dict[str, Any]) -> None:
        del node["metadata"]["labels"][CP]

    emu.mutate("nodes", NODE, unlabel)
    view = owner.confirm(5.0)
    assert view.known and not view.selects and view.detail == f"nodeSelector {CP}= does not match the node's labels"


def test_confirm_sees_a_deletion_the_watch_has_not_delivered(emu: KubeEmulator, owner: OwnerWatcher) -> None:
    emu.create(daemonset())
    emu.create(pod())
    owner.start()
    assert wait_until(lambda: owner.view().selects, 10)
    assert owner._watcher is not None
    owner._watcher.stop()  # the watch event of the deletion does not come (it races the pod's SIGTERM)
    emu.delete("daemonsets", DS, NS, "apps")
    assert owner.view().exists
    assert not owner.confirm(5.0).exists


def test_a_pod_without_a_daemonset_owner_never_becomes_known(emu: KubeEmulator, owner: OwnerWatcher) -> None:
    emu.create(daemonset())
    emu.create(pod(None))
    owner.start()
    assert wait_until(lambda: "has no DaemonSet owner" in owner.view().detail, 10), owner.view()
    assert not owner.confirm(1.0).known


def test_confirm_with_the_api_black_holed_is_bounded_and_keeps_the_watched_view(
        emu: KubeEmulator, owner: OwnerWatcher) -> None:
    emu.create(daemonset())
    emu.create(pod())
    owner.start()
    assert wait_until(lambda: owner.view().selects, 10)
    port = emu.port
    emu.go_down("refuse")
    hole = BlackHole(port)
    try:
        started = time.monotonic()
        view = owner.confirm(0.25)
        took = time.monotonic() - started
        assert view.successor() is not None  # the last answer stands
        assert took < 5.0  # bounded (the figure itself is measured in bench/agent_bench.py, not asserted here)
    finally:
        hole.close()


def test_access_revoked_at_the_stop_reads_as_an_uninstall(emu: KubeEmulatorExt, owner: OwnerWatcher) -> None:
    """``kubectl delete -k`` deletes the Role (or the ServiceAccount) along with the DaemonSet: a 403 or 401
    at the stop, from an agent that could read its DaemonSet before, means it is being uninstalled."""
    emu.create(daemonset())
    emu.create(pod())
    owner.start()
    assert wait_until(lambda: owner.view().selects, 10)
    emu.fail("GET", f"{DAEMONSETS}/{DS}", 403)
    view = owner.confirm(5.0)
    assert view.known and not view.exists and view.successor() is None
    assert view.gone().startswith(f"DaemonSet {DS} is gone (the agent may no longer read it: ")


def test_a_node_read_that_failed_at_start_is_retried_with_the_daemonsets_answer(
        emu: KubeEmulatorExt, owner: OwnerWatcher) -> None:
    emu.create(daemonset())
    emu.create(pod())
    emu.fail("GET", f"/api/v1/nodes/{NODE}", 503)
    owner.start()
    assert wait_until(lambda: owner.view().selects, 10), owner.view()
    assert len(emu.requests("GET", f"/api/v1/nodes/{NODE}")) >= 2
