"""One warm verdict on the real kube-apiserver with thousands of pods in kube-system: what it costs.

Three control-plane nodes registered by their kubelets' identities with kubeadm's labelled scheduler mirror
pods (bench/gate_real_bench.py's), the seed's corner case (an unlabelled kube-scheduler on an unlabelled node,
published by that node's identity as the kubelet publishes a mirror pod), and 2 000 DaemonSet-like pods of
bench/verdict_scale.py in kube-system. The scheduler index follows the namespace's metadata
(``PartialObjectMetadata``, as the real server answers it: the emulator is checked against it here), and a warm
verdict then costs a few small requests whatever kube-system holds (the goal at 20 000 pods: <= 10 requests,
<= 100 KB; bench/verdict_scale.py measures that size), and decides as the one-shot read does, the corner case
counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.gate_real_bench import Conn, control_plane_nodes, each
from bench.verdict_scale import AGENTS_OF_A_NODE, node_agent_pod
from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.cluster import collect
from patcher.adapters.kube.schedindex import SchedulerIndex
from patcher.adapters.kube.transport import METADATA_LIST, PODS, Api
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod
from tests.harness.emu.kubeletsim import static_pod_annotations
from tests.harness.real.controlplane import ControlPlane, built_releases, control_plane, missing_reason
from tests.harness.real.node_client import NodeClient
from tests.harness.traffic import Traffic

pytestmark = pytest.mark.real_cluster

KUBE_SYSTEM_PODS = 2000
BARE = "bare-1"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of its own: the pods made here would stay in a shared one's kube-system."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    with control_plane(built_releases()[0], tmp_path / "cp") as cp:
        yield cp


def populate(cp: ControlPlane) -> None:
    control_plane_nodes(cp)
    bare = NodeClient(cp, BARE).register()
    pod = make_mirror_pod(node_name=BARE, annotations=static_pod_annotations({}, "0b5e1ec7ed0000000000000000000001"),
                          started_at="2026-11-21T23:40:01Z")
    bare.set_pod(pod)  # no labels: the kubelet copies a manifest's labels, and this one has none
    for agent in AGENTS_OF_A_NODE:
        cp.ok("POST", "/api/v1/namespaces/kube-system/serviceaccounts", {"metadata": {"name": agent}})
    conn = Conn(cp)

    def create(i: int) -> None:
        _, body = node_agent_pod(i, f"worker-{i // 4:04d}")
        status, answer = conn.send("POST", "/api/v1/namespaces/kube-system/pods", body)
        assert status == 201, answer[:300]

    each(create, KUBE_SYSTEM_PODS, 8)


def shape(answer: dict[str, Any]) -> tuple[str, str, set[tuple[str, ...]]]:
    return answer["kind"], answer["apiVersion"], {tuple(sorted(i)) for i in answer["items"]}


def test_a_warm_verdict_costs_the_control_plane_not_kube_system(plane: ControlPlane) -> None:
    cp = plane
    populate(cp)
    api: Api = build_api_client(ClientSettings(kubeconfig=str(cp.kubeconfig), timeout=(5.0, 60.0)))
    index = SchedulerIndex(api)
    index.start()
    try:
        assert index.wait_fresh(60), "the metadata-only list and watch of kube-system"
        assert index.candidates() == [f"kube-scheduler-{n}" for n in (BARE, "cp-1", "cp-2", "cp-3")]
        one_shot = collect(api)  # a metadata-only list of the namespace instead of the index
        verdict = collect(api, index=index)
        assert verdict == one_shot
        rows = {r.node: (r.selected, r.ready, r.reason) for r in verdict.rows}
        assert rows[BARE] == (False, False, "kube-scheduler runs here, no agent reports")
        assert not verdict.ready
        traffic = Traffic(api)
        assert collect(api, index=index) == verdict
        cost = (traffic.requests, traffic.received)
        # two Node lists, the labelled schedulers, the unlabelled one by name, its Node by name
        assert cost[0] == 5 and cost[1] <= 100_000, cost
        # the one-shot read lists the namespace's metadata, page by page: more, but no spec or status of any pod
        traffic = Traffic(api)
        collect(api)
        assert traffic.requests == 5 + (KUBE_SYSTEM_PODS + 4) // 500 + 1
        # the emulator answers a metadata-only list in the real server's shape
        real = api.list(PODS, namespace="kube-system", limit=2, accept=METADATA_LIST)
        with KubeEmulator() as emu:
            emu.set_pod(make_mirror_pod(node_name="cp-1"))
            emu.set_pod(make_mirror_pod(node_name="cp-2"))
            emu_api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(
                Path(cp.workdir) / "emu.kubeconfig"))))
            try:
                emulated = emu_api.list(PODS, namespace="kube-system", limit=2, accept=METADATA_LIST)
            finally:
                emu_api.close()
        assert shape(real) == shape(emulated) == (
            "PartialObjectMetadataList", "meta.k8s.io/v1", {("apiVersion", "kind", "metadata")})
    finally:
        index.stop()
        api.close()
