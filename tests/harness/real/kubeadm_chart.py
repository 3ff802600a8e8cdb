"""The chart on the kubeadm cluster (tests/harness/real/kubeadm_cluster.py): the agent's image on every node, the
chart's values this sandbox needs, the real helm in a node, and the reads that tell where a journey stands (the
Nodes settled, the agents, their states, each node's running kube-scheduler and its flags, the Lease holders).
Shared by tests/real/test_real_kubeadm_cluster.py and bench/rollout_gap.py.
"""

from __future__ import annotations

import calendar
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.harness.helpers import P
from tests.harness.real.agent_image import agent_image
from tests.harness.real.controlplane import wait_until
from tests.harness.real.helmtool import NAMESPACE, RELEASE, find_helm
from tests.harness.real.kubeadm_cluster import ENDPOINT, ENDPOINT_ADDRESS, KubeadmCluster
from tests.harness.real.kubeadm_node import KubeadmNode
from tests.harness.real.kubeadm_upgrade import drain, pid_in, restart_kubelet, uncordon

CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def settled_nodes(cluster: KubeadmCluster) -> list[str] | None:
    """The Nodes' names once all are Ready with kubeadm's label and only its taint (the kubelet registers each with
    `not-ready`, which the node lifecycle controller takes off a moment after the Node turned Ready)."""
    nodes = cluster.first.get("/api/v1/nodes")
    assert nodes is not None
    kubeadms = [(CONTROL_PLANE, "NoSchedule")]
    names = sorted(n["metadata"]["name"] for n in nodes["items"]
                   if ready(n) and CONTROL_PLANE in n["metadata"]["labels"]
                   and [(t["key"], t["effect"]) for t in n["spec"].get("taints") or []] == kubeadms)
    return names if len(names) == cluster.size else None


def lease_holder(node: KubeadmNode, name: str) -> str | None:
    """The node whose component holds kube-system's Lease `name` (holderIdentity is `<node>_<uuid>`)."""
    lease = node.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}")
    holder = str((lease or {}).get("spec", {}).get("holderIdentity") or "")
    return holder.split("_", 1)[0] or None


SCHEDULER_CONFIG = "/etc/kubernetes/scheduler-patcher/"


def agent_image_on(cluster: KubeadmCluster) -> tuple[str, str]:
    """(repository, tag) of the agent's image as every node's runtime has it: built here from this checkout and
    imported into each node's containerd (no registry is reachable here). The chart then runs it with
    `pullPolicy: Never`; a registry's pull would take this one function's place. A node that has the name already
    has this very image (the tag is a hash of its inputs): the journeys sharing a cluster import it once."""
    image = agent_image()
    for node in cluster.nodes:
        if image.name not in node.ctr("images", "ls", "-q").split():
            node.ctr("images", "import", str(image.archive))
        assert image.name in node.ctr("images", "ls", "-q").split()
    repository, tag = image.name.rsplit(":", 1)
    return repository, tag


def next_agent_image_on(cluster: KubeadmCluster, repository: str, tag: str) -> str:
    """A new tag of the agent's image in every node's containerd, for `helm upgrade`: what a release rebuilt from
    the same sources is (`make image` with another REVISION), an image of its own (another config, so another image
    ID and digest: containerd and the kubelet see a different image, not a second name of the same one) whose code
    renders the same scheduler config. Built on the current image (`FROM` it, one label changed: no layer is
    rebuilt), saved and imported as `agent_image_on` does; returns the new tag."""
    current = f"{repository}:{tag}"
    new_tag = f"{tag}-next"
    name = f"{repository}:{new_tag}"
    with tempfile.TemporaryDirectory(prefix="agent-next-") as folder:
        context = Path(folder)
        if subprocess.run(["podman", "image", "exists", name], capture_output=True, timeout=60,
                          check=False).returncode:
            (context / "Containerfile").write_text(
                f"FROM {current}\nLABEL org.opencontainers.image.revision={new_tag}\n")
            _podman("build", "--pull=never", "-t", name, str(context), timeout=300)
        ids = [_podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip() for image in (current, name)]
        assert ids[0] != ids[1], ids  # an image of its own, not a second name
        archive = context / "next.tar"
        _podman("save", "--format", "docker-archive", "-o", str(archive), name, timeout=600)
        for node in cluster.nodes:
            node.ctr("images", "import", str(archive))
            assert name in node.ctr("images", "ls", "-q").split()
        os.unlink(archive)
    return new_tag


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"podman {' '.join(args[:3])}: {proc.stderr[-3000:]}"
    return proc


def chart_values(repository: str, tag: str) -> dict[str, Any]:
    """The chart's values for this cluster: the imported image, one extender (ignorable: nothing listens on it, the
    scheduler only calls it to place a pod), and two things this sandbox lacks. No kube-proxy routes the
    `kubernetes` Service's ClusterIP, which the kubelet puts in KUBERNETES_SERVICE_HOST: the agents (host network)
    get the API endpoint's address instead (the container's env wins over the kubelet's). The pod network is
    loopback only, so the hooks' Jobs (not host network) could reach no API server: both are off; the journey runs
    the pre-delete hook's command (`stop-agents`) itself in a node's network before `helm uninstall`, and the
    agents' own restore on exit is what the uninstall relies on here."""
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "extenders": [{"urlPrefix": "http://127.0.0.1:8889", "filterVerb": "filter", "weight": 1,
                       "ignorable": True}],
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": ENDPOINT_ADDRESS},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": ENDPOINT.rsplit(":", 1)[1]}],
        "restoreJob": {"enabled": False},
        "stopAgentsJob": {"enabled": False},
    }


def agents(node: KubeadmNode) -> list[dict[str, Any]]:
    pods = node.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
    return list((pods or {}).get("items") or [])


def states(cluster: KubeadmCluster) -> dict[str, str]:
    nodes = cluster.first.get("/api/v1/nodes")
    assert nodes is not None
    return {n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(f"{P}state", "")
            for n in nodes["items"]}


def scheduler_config(node: KubeadmNode) -> tuple[str, list[str]] | None:
    """(container ID, its --config flags) of the node's running, ready kube-scheduler; None while there is none."""
    running = node.running()
    if running is None:
        return None
    container = next(c for c in running[1]["spec"]["containers"] if c["name"] == "kube-scheduler")
    return running[0], [w for w in container.get("command", []) if w.startswith("--config=")]


def scheduler_run(node: KubeadmNode) -> tuple[str, int, str, list[str]] | None:
    """(the static pod's config hash, its container's restart count, container ID, its --config flags) of the node's
    running, ready kube-scheduler; None while there is none. The same hash with a higher count: the kubelet restarted
    the same pod's container after the scheduler exited by itself (a leader election lost on a loaded machine), not
    for a new manifest."""
    running = node.running()
    if running is None:
        return None
    pod = running[1]
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "kube-scheduler")
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler")
    return (pod["metadata"]["annotations"]["kubernetes.io/config.hash"], int(status.get("restartCount") or 0),
            running[0], [w for w in container.get("command", []) if w.startswith("--config=")])


def stop_agents_in(node: KubeadmNode) -> subprocess.CompletedProcess[str]:
    """`scheduler-patcher stop-agents` (the chart's pre-delete hook's command, off in `chart_values`) in the node's
    network, as kubeadm's admin: `helm uninstall` as it runs with its hook."""
    argv = [sys.executable, "-m", "patcher", "stop-agents", "--kubeconfig=/etc/kubernetes/admin.conf",
            f"--namespace={NAMESPACE}", "--timeout=4m"]
    return subprocess.run(node.inside(argv, pid_namespace=False), capture_output=True, text=True, timeout=300,
                          check=False, cwd=Path(__file__).resolve().parents[3])


def helm_in(node: KubeadmNode, helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real helm (`helm`, its path) in the node's network (the API endpoint is reachable there only), as
    kubeadm's admin."""
    return subprocess.run(node.inside([helm, *args, "--kubeconfig=/etc/kubernetes/admin.conf"], pid_namespace=False),
                          capture_output=True, text=True, timeout=300, check=False)


def helm_path() -> str:
    """The real helm's path (`find_helm`); the test skips with the reason where there is none, fails under CI=true."""
    path, why = find_helm()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no helm under CI=true: {why}")
        pytest.skip(why)
    return path


def uninstall(node: KubeadmNode, helm: str) -> None:
    """`helm uninstall` as it runs with the chart's pre-delete hook (off in `chart_values`): `stop-agents` in the
    node's network until the DaemonSet and its pods are gone, then the release's removal; each must succeed."""
    stop = stop_agents_in(node)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "and its pods are gone" in stop.stdout and not agents(node), stop.stdout
    proc = helm_in(node, helm, "uninstall", RELEASE, f"--namespace={NAMESPACE}")
    assert proc.returncode == 0, proc.stderr


def daemonset(node: KubeadmNode) -> dict[str, Any]:
    found = node.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/scheduler-patcher")
    assert found is not None, "the agents' DaemonSet is gone"
    return found


def rolled_out(node: KubeadmNode, image: str) -> list[dict[str, Any]] | None:
    """The agents' pods once the DaemonSet's rolling update to `image` is done, as the controller and the pods both
    tell it: the controller saw the new template (observedGeneration), every scheduled pod is of it and available
    (updatedNumberScheduled, numberAvailable, no numberUnavailable), and the pods themselves agree: one per desired
    node, none terminating, each running `image` and Ready. None until then."""
    ds = daemonset(node)
    status = ds.get("status") or {}
    desired = status.get("desiredNumberScheduled")
    if (status.get("observedGeneration") != ds["metadata"]["generation"] or not desired
            or status.get("updatedNumberScheduled") != desired or status.get("numberAvailable") != desired
            or status.get("numberUnavailable")):
        return None
    pods = agents(node)
    if len(pods) != desired or any(p["metadata"].get("deletionTimestamp") for p in pods):
        return None
    if any(p["spec"]["containers"][0]["image"] != image or not ready(p) for p in pods):
        return None
    return pods


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ready_since(pod: dict[str, Any]) -> datetime:
    return _stamp(next(c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "Ready"))


def created(pod: dict[str, Any]) -> datetime:
    return _stamp(pod["metadata"]["creationTimestamp"])


def each_waited_for_the_last(pods: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The rolled-out pods that the DaemonSet controller created before the one it created just before them was
    Ready: (pod, created, the earlier pod's Ready) for each; [] when it waited for every new agent's readiness
    (maxUnavailable 1 with maxSurge 0 and no minReadySeconds: the next node's old agent is deleted, and its new one
    created, only once the previous new one is available). The API's stamps have whole seconds: a pod created in
    the second its predecessor turned Ready counts as waiting."""
    ordered = sorted(pods, key=created)
    return [(p["metadata"]["name"], str(created(p)), str(ready_since(before)))
            for before, p in itertools.pairwise(ordered) if created(p) < ready_since(before)]


def files_of(node: KubeadmNode, paths: list[str]) -> dict[str, tuple[int, int, bytes]]:
    """(inode, mtime ns, bytes) of each node file, and of each file in each folder among `paths`: a write of the
    same bytes (a temp file renamed over it) shows as another inode."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for path in paths:
        host = node.host(path)
        for file in sorted(host.iterdir()) if host.is_dir() else [host]:
            st = file.stat()
            out[str(file.relative_to(node.host("/")))] = (st.st_ino, st.st_mtime_ns, file.read_bytes())
    return out


def events(node: KubeadmNode, reason: str) -> dict[str, int]:
    """How many Events of `reason` each Node was the subject of (an Event's count, for a series)."""
    found = node.get(f"/api/v1/events?fieldSelector=reason%3D{reason}")
    counts: dict[str, int] = {}
    for event in (found or {}).get("items") or []:
        if event["involvedObject"].get("kind") == "Node":
            name = event["involvedObject"]["name"]
            counts[name] = counts.get(name, 0) + int(event.get("count") or 1)
    return counts


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def restart_containerd(node: KubeadmNode) -> None:
    """containerd stopped (SIGTERM, as `systemctl restart containerd` does: its shims and the containers they run
    go on) and started again with the same config, as the node's start did; returns once it answers."""
    pid = pid_in(node, "containerd")
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: _gone(pid), 60, f"containerd's exit on {node.name}")
    node.spawn("containerd", ["containerd", f"--config={node.run / 'containerd.toml'}"])

    def answers() -> bool:
        return subprocess.run(["ctr", f"--address={node.socket}", "--namespace=k8s.io", "version"],
                              capture_output=True, timeout=30, check=False).returncode == 0
    wait_until(answers, 120, f"containerd answering again on {node.name}")


def kubelet_answers(node: KubeadmNode) -> bool:
    """The node's kubelet says it is healthy (its healthz: the sync loop and the runtime's pod events)."""
    proc = subprocess.run(node.inside(["curl", "-sS", "--fail", "--max-time", "5", "http://127.0.0.1:10248/healthz"]),
                          capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def _restart_kubelet(node: KubeadmNode) -> None:
    """The kubelet restarted (as `systemctl restart kubelet`), and back: an operator waits for that before the next
    step (here no systemd would start a kubelet again that exited because containerd was away at its start)."""
    restart_kubelet(node, node.binaries, node.binaries)
    wait_until(partial(kubelet_answers, node), 120, f"the restarted kubelet healthy on {node.name}")


def _restart_containerd(node: KubeadmNode) -> None:
    """containerd restarted; the running kubelet rides it out (the same process, healthy again)."""
    kubelet = pid_in(node, "kubelet")
    restart_containerd(node)
    wait_until(partial(kubelet_answers, node), 120, f"the kubelet healthy again on {node.name}")
    assert pid_in(node, "kubelet") == kubelet, "the kubelet did not ride out containerd's restart"


def drain_and_restart(node: KubeadmNode) -> list[str]:
    """A node's maintenance in the middle of a rollout, as an operator does it: `kubectl drain` (cordon, the
    evictions; the agent is a DaemonSet's pod and stays, the static pods are not evicted), its kubelet restarted
    (the same release: kubeadm's flags), containerd restarted, `kubectl uncordon`, each step done before the next.
    Returns what was done, with the seconds each step took."""
    steps: list[tuple[str, Callable[[], None]]] = [
        ("drain", partial(drain, node)),
        ("kubelet restart", partial(_restart_kubelet, node)),
        ("containerd restart", partial(_restart_containerd, node)),
        ("uncordon", partial(uncordon, node))]
    done = []
    for what, step in steps:
        started = time.monotonic()
        step()
        done.append(f"{what} {time.monotonic() - started:.1f} s")
    return done


def configs_run(timeline_events: list[tuple[float, str, bool, str]], node: str, since: float) -> list[str]:
    """The config hashes the node's scheduler ran ready from `since` on, each once per stretch: a node patched once
    shows [original, patched]; one patched twice (a rollback and a second write, or a restore and a re-patch)
    shows more. A mirror pod that goes and comes back with the same hash (a kubelet restart) adds nothing."""
    ran: list[str] = []
    for stamp, name, is_ready, config in timeline_events:
        if name != node or not is_ready or not config:
            continue
        if stamp < since:
            ran = [config]  # what it ran when the window opened
        elif not ran or ran[-1] != config:
            ran.append(config)
    return ran


def unpatched(node: KubeadmNode) -> bool:
    """The node's kube-scheduler runs, ready, without `--config`: kubeadm's manifest."""
    running = scheduler_config(node)
    return running is not None and running[1] == []


def cri_time(stamp: str) -> float:
    """time.time() of a CRI log line's stamp (RFC 3339 in UTC, up to nine digits of fraction, trailing zeros cut)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", stamp)
    assert match, stamp
    return calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")) + float(f"0.{match.group(2) or 0}")


def agent_log(node: KubeadmNode) -> list[tuple[float, str]]:
    """(time, text) of every line the node's agent containers wrote, in time order: the kubelet's files of the
    agents' pods on that node (`/var/log/pods`, a node path; each line `<stamp> <stream> <F|P> <text>`), every
    container that ran (a restarted one's file stays)."""
    rows = []
    for file in node.host("/var/log/pods").glob(f"{NAMESPACE}_*/agent/*.log"):
        for line in file.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                rows.append((cri_time(parts[0]), parts[3]))
    return sorted(rows)


class AgentLogs:
    """The agents' lines (`agent_log`), read every half second until `stop`: a pod's files go with the pod, and what
    the agents said on their way out is what a failed uninstall needs."""

    def __init__(self, nodes: list[KubeadmNode]) -> None:
        self.nodes = nodes
        self.rows: dict[str, set[tuple[float, str]]] = {n.name: set() for n in nodes}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-logs", daemon=True)

    def start(self) -> AgentLogs:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(0.5):
            for node in self.nodes:
                try:
                    self.rows[node.name].update(agent_log(node))
                except OSError:  # a file removed with its pod while it was read
                    continue

    def stop(self) -> dict[str, set[tuple[float, str]]]:
        self._done.set()
        self._thread.join(10)
        return self.rows
