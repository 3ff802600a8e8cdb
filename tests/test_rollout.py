"""The rollout Lease against the API emulator: turns, takeover of a dead holder, the list of failed sources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.kube.client import ClientSettings, build_api_client
from patcher.rollout import RolloutLease
from tests.kubeemu import KubeEmulator

NS = "scheduler-patcher"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    with KubeEmulator() as e:
        yield e


def lease(emu: KubeEmulator, tmp_path: Path, holder: str, clock: Clock) -> RolloutLease:
    api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / f"kc-{holder}"))))
    return RolloutLease(api, NS, "scheduler-patcher-rollout", holder, duration=60, clock=clock)


def test_one_holder_at_a_time_and_release_hands_over(emu: KubeEmulator, tmp_path: Path) -> None:
    clock = Clock()
    a, b = lease(emu, tmp_path, "cp-1", clock), lease(emu, tmp_path, "cp-2", clock)
    assert a.acquire() and a.held
    assert not b.acquire() and b.current_holder == "cp-1" and not b.held
    assert a.acquire()  # renewing our own
    a.release()
    assert not a.held
    assert b.acquire() and b.held
    stored = emu.get("leases", "scheduler-patcher-rollout", NS, "coordination.k8s.io") or {}
    assert stored["spec"]["holderIdentity"] == "cp-2" and stored["spec"]["leaseTransitions"] == 1


def test_a_dead_holder_is_superseded_and_learns_it_lost_the_lease(emu: KubeEmulator, tmp_path: Path) -> None:
    clock = Clock()
    a, b = lease(emu, tmp_path, "cp-1", clock), lease(emu, tmp_path, "cp-2", clock)
    assert a.acquire()
    clock.now += 30
    assert not b.acquire()  # not expired yet
    clock.now += 31
    assert b.acquire()  # renewTime + 60 s has passed
    assert not a.acquire() and not a.held and a.current_holder == "cp-2"


def test_a_failed_source_is_recorded_and_refused_on_the_same_read(emu: KubeEmulator, tmp_path: Path) -> None:
    clock = Clock()
    a, b = lease(emu, tmp_path, "cp-1", clock), lease(emu, tmp_path, "cp-2", clock)
    assert a.acquire("src-1")
    a.release(bad_hash="src-1")
    assert not b.acquire("src-1") and b.refused_bad and not b.held  # the bad list and the Lease: one read
    assert b.acquire("src-2") and not b.refused_bad
    stored = emu.get("leases", "scheduler-patcher-rollout", NS, "coordination.k8s.io") or {}
    assert stored["metadata"]["annotations"]["scheduler-patcher.io/bad-source-hashes"] == "src-1"


def test_api_down_means_not_acquired_never_an_exception(emu: KubeEmulator, tmp_path: Path) -> None:
    clock = Clock()
    a = lease(emu, tmp_path, "cp-1", clock)
    emu.go_down("refuse")
    assert not a.acquire()
    a.release(bad_hash="x")  # logs, does not raise
    emu.come_up()
    assert a.acquire()
