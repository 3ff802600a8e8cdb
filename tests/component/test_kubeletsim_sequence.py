"""tests/harness/emu/kubeletsim.py against what the real kubelet was recorded doing on a `kubeadm init` node.

tests/fixtures/kubelet/kube-scheduler-sequence.json holds the mirror pod's watch events the real kubelet (the newest
release built here) made the API server send when the agent patched kube-scheduler's manifest, restored it, and
when the file was touched, rewritten with the same bytes, or with the same pod's keys in another order
(tests/real/test_real_kubelet_sequence.py records it). Here the simulated kubelet meets the same writes, with the
same manifest bytes, on the API emulator, and a watch of its mirror pod must see the same steps
(`mirrorseq.shape`), on which the agent's restart check must say the same things in the same order
(`mirrorseq.verdicts`). The real sequence itself is held to what the agent relies on.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.harness import mirrorseq
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.emu.kubeletsim import SimKubelet

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "kubelet" / "kube-scheduler-sequence.json"
REAL: dict[str, Any] = json.loads(FIXTURE.read_text())
NODE = REAL["mirrorPod"].removeprefix("kube-scheduler-")
ORIGINAL = (ROOT / "tests" / "fixtures" / "kubeadm" / "kube-scheduler.yaml").read_text().replace(
    "kube-scheduler:v1.37.2", f"kube-scheduler:v{REAL['release']}")
RESTARTS = [name for name, step in REAL["steps"].items() if step["write"] in ("apply", "restore")]
NO_OPS = [name for name in REAL["steps"] if name not in RESTARTS]


class EmuWatch:
    """A watch of the mirror pod on the emulator, as the agent opens it (by name), each event stamped."""

    def __init__(self, emu: KubeEmulator, name: str) -> None:
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        pod = emu.get("pods", name, "kube-system")
        assert pod is not None
        self.events.append((time.time_ns(), "GET", pod))
        url = (f"{emu.url}/api/v1/namespaces/kube-system/pods?watch=true&fieldSelector=metadata.name%3D{name}"
               f"&resourceVersion={pod['metadata']['resourceVersion']}")
        self._stream = urllib.request.urlopen(url, timeout=30)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self._stream:
            try:
                for line in self._stream:
                    if line.strip():
                        event = json.loads(line)
                        self.events.append((time.time_ns(), event["type"], event["object"]))
            except (OSError, ValueError, http.client.HTTPException):
                return  # the stream dropped at the end (`close`)

    def saw_ready(self, other_than: str) -> bool:
        """The last event is of a pod other than ``other_than``, its scheduler running and ready."""
        _, kind, pod = self.events[-1]
        return kind != "DELETED" and _running_ready(pod, other_than)

    def more_than(self, count: int) -> bool:
        return len(self.events) > count

    def close(self, emu: KubeEmulator) -> None:
        """Ends the stream at the server's end (the reader then closes its own)."""
        emu.drop_watches()
        self._reader.join(10)

    def window(self, since_ns: int, written_ns: int) -> list[dict[str, Any]]:
        before = [e for e in self.events if e[0] < since_ns and e[1] != "DELETED"]
        return [mirrorseq.compact("BEFORE", before[-1][2], (before[-1][0] - written_ns) / 1e9, REAL["marker"]),
                *(mirrorseq.compact(kind, pod, (at - written_ns) / 1e9, REAL["marker"])
                  for at, kind, pod in self.events if at >= since_ns and kind != "GET")]


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _running_ready(pod: dict[str, Any] | None, other_than: str | None) -> bool:
    if pod is None or pod["metadata"]["uid"] == other_than:
        return False
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0]["state"] and statuses[0].get("ready") is True


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """The simulated kubelet's steps for the writes of the recorded run, in its order: the events a watch saw and
    the write's mtime."""
    root = tmp_path_factory.mktemp("node")
    manifest = root / REAL["manifest"].lstrip("/")
    manifest.parent.mkdir(parents=True)
    manifest.write_text(ORIGINAL)
    for step in REAL["steps"].values():
        for node_path, text in (step.get("configFiles") or {}).items():
            (root / node_path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / node_path.lstrip("/")).write_text(text)
    steps: dict[str, dict[str, Any]] = {}
    with KubeEmulator() as emu:
        kubelet = SimKubelet(emu, NODE, root, full_spec=True).start()
        try:
            assert wait_until(lambda: _running_ready(emu.get("pods", REAL["mirrorPod"], "kube-system"), None), 30)
            watch = EmuWatch(emu, REAL["mirrorPod"])
            for name, step in REAL["steps"].items():
                before = emu.get("pods", REAL["mirrorPod"], "kube-system")
                assert before is not None
                since = time.time_ns()
                if step["write"] == "utime":
                    os.utime(manifest)
                else:
                    _replace(manifest, step["manifest"])
                written = manifest.stat().st_mtime_ns
                if name in RESTARTS:
                    assert wait_until(partial(watch.saw_ready, before["metadata"]["uid"]), 30), name
                    # the kubelet's next passes send nothing more once the scheduler is ready (nor did the real one)
                    assert not wait_until(partial(watch.more_than, len(watch.events)), 0.5), name
                else:
                    kubelet.sync()
                    kubelet.sync()
                steps[name] = {"written": written, "events": watch.window(since, written)}
            watch.close(emu)
        finally:
            kubelet.stop()
    yield steps


@pytest.mark.parametrize("name", list(REAL["steps"]))
def test_the_stand_in_shows_the_steps_the_real_kubelet_showed(simulated: dict[str, dict[str, Any]],
                                                              name: str) -> None:
    real = REAL["steps"][name]["events"]
    assert mirrorseq.shape(simulated[name]["events"]) == mirrorseq.shape(real)


@pytest.mark.parametrize("name", RESTARTS)
def test_the_agent_judges_the_stand_in_as_it_judges_the_real_kubelet(simulated: dict[str, dict[str, Any]],
                                                                     name: str) -> None:
    step = REAL["steps"][name]
    real_written = _written_ns(step)
    expected = step["expectedHash"]
    real = mirrorseq.verdicts(step["events"], marker_key=REAL["marker"], expected_hash=expected,
                              written_ns=real_written)
    sim = mirrorseq.verdicts(simulated[name]["events"], marker_key=REAL["marker"], expected_hash=expected,
                             written_ns=simulated[name]["written"])
    assert sim == real
    assert real[-1] in ("Ready", "unpatched")


def _written_ns(step: dict[str, Any]) -> int:
    """The write's instant of a recorded step: its events' arrival is kept in seconds after it, and the
    `BEFORE` pod's container start (an absolute stamp) ties the two together."""
    return int(step["writtenNs"])
