"""The rollout Lease against the API emulator: turns, takeover of a dead holder, the list of failed sources.

The Lease is an actor: ``acquire``/``release`` post intents and return at once, ``settle`` waits (bounded) until
the actor has tried them. Expiry is judged on the observer's injected monotonic clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.services.rollout import RolloutLease
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.kubeemu import KubeEmulator, wait_until
from tests.harness.helpers import Clock

NS = "scheduler-patcher"


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    with KubeEmulator() as e:
        yield e


def lease(emu: KubeEmulator, tmp_path: Path, holder: str, clock: Clock | None = None) -> RolloutLease:
    api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / f"kc-{holder}"))))
    return RolloutLease(api, NS, "scheduler-patcher-rollout", holder, duration=60, clock=clock or time.monotonic)


def take(lease: RolloutLease, source: str = "") -> bool:
    lease.acquire(source)
    return lease.settle(10)


def stored(emu: KubeEmulator) -> dict:  # type: ignore[type-arg]
    return emu.get("leases", "scheduler-patcher-rollout", NS, "coordination.k8s.io") or {}


def test_one_holder_at_a_time_and_release_hands_over(emu: KubeEmulator, tmp_path: Path) -> None:
    a, b = lease(emu, tmp_path, "cp-1"), lease(emu, tmp_path, "cp-2")
    assert take(a) and a.held and a.acquire()  # held: answered from the snapshot
    assert not take(b) and b.current_holder == "cp-1" and not b.held
    a.release()
    assert not a.held  # at once: the loop never waits for the API
    a.settle(10)
    assert take(b) and b.held
    assert stored(emu)["spec"]["holderIdentity"] == "cp-2" and stored(emu)["spec"]["leaseTransitions"] == 0
    a.close(5)
    b.close(5)


def test_a_dead_holder_is_superseded_only_after_a_full_duration_on_the_observers_clock(
        emu: KubeEmulator, tmp_path: Path) -> None:
    """The remote renewTime is never compared with the local wall clock (skew decides
    nothing); a record unchanged for leaseDurationSeconds since *we* first saw it is expired."""
    clock = Clock()
    a, b = lease(emu, tmp_path, "cp-1", clock), lease(emu, tmp_path, "cp-2", clock)
    assert take(a)
    a.close(5)  # dies without releasing
    emu.mutate("leases", "scheduler-patcher-rollout",  # its node's clock is an hour behind: no matter
               lambda obj: {**obj, "spec": {**obj["spec"], "renewTime": "2001-01-01T00:00:00.000000Z"}}, NS,
               "coordination.k8s.io")
    assert not take(b)  # first seen now: not expired, however old its renewTime looks
    clock.now += 59
    assert not take(b)
    clock.now += 2
    assert take(b)  # unchanged for 61 s on b's own clock
    assert stored(emu)["spec"]["holderIdentity"] == "cp-2" and stored(emu)["spec"]["leaseTransitions"] == 1
    b.close(5)


def test_a_holder_that_was_superseded_learns_it(emu: KubeEmulator, tmp_path: Path) -> None:
    a, b = lease(emu, tmp_path, "cp-1"), lease(emu, tmp_path, "cp-2")
    assert take(a)
    emu.mutate("leases", "scheduler-patcher-rollout",
               lambda obj: {**obj, "spec": {**obj["spec"], "holderIdentity": "cp-2"}}, NS, "coordination.k8s.io")
    a._last_renew = -1e9  # a renewal is due now
    a.acquire()
    with a._cond:
        a._cond.notify_all()
    assert wait_until(lambda: not a.held, 10) and a.current_holder == "cp-2"
    a.close(5)
    b.close(5)


def test_a_failed_source_is_recorded_and_refused_on_the_same_read(emu: KubeEmulator, tmp_path: Path) -> None:
    a, b = lease(emu, tmp_path, "cp-1"), lease(emu, tmp_path, "cp-2")
    assert take(a, "src-1")
    a.release(bad_hash="src-1")
    a.settle(10)
    assert not take(b, "src-1") and b.refused_bad and not b.held  # the bad list and the Lease: one read
    assert not b.acquire("src-1") and b.refused_bad  # remembered: not asked again
    assert take(b, "src-2") and not b.refused_bad
    assert stored(emu)["metadata"]["annotations"]["scheduler-patcher.io/bad-source-hashes"] == "src-1"
    a.close(5)
    b.close(5)


def test_api_down_means_not_acquired_never_an_exception(emu: KubeEmulator, tmp_path: Path) -> None:
    a = lease(emu, tmp_path, "cp-1")
    emu.go_down("refuse")
    assert not take(a) and a.api_answered is False
    a.release(bad_hash="x")  # logs, does not raise
    a.settle(10)
    emu.come_up()
    assert take(a)
    a.close(5)


def test_a_black_holed_api_never_blocks_the_caller_and_close_keeps_its_budget(tmp_path: Path) -> None:
    """Acquire/release took 20 s each against an API that never answers."""
    hole = BlackHole()
    try:
        kc = tmp_path / "kc"
        kc.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{hole.port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
        a = RolloutLease(build_api_client(ClientSettings(kubeconfig=str(kc))), NS, "scheduler-patcher-rollout",
                         "cp-1")
        clock = time.monotonic
        t0 = clock()
        assert not a.acquire("src")
        a.release(bad_hash="src")
        calls = clock() - t0
        assert not a.settle(0.3)  # bounded wait: no answer yet
        a.close(0.5)
        assert not a._thread.is_alive() or a._budget_end is not None
        # Intents are posted without a round trip; the generous bound only guards against a call on the caller.
        assert calls < 2.0
    finally:
        hole.close()
