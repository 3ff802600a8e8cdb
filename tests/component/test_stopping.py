"""The stop's executor (``patcher.services.stopping``): what it reports back to the step about the API."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from patcher.core import lifecycle
from patcher.core.settings import Files
from patcher.services import engine
from patcher.services.stopping import Stopping
from tests.harness import helpers


class SlowLease:
    """A Lease actor whose answer to the stop's request comes after the confirm wait, while the restore runs
    (``late=True``), or never (``late=False``: the API black-holed)."""

    def __init__(self, *, late: bool) -> None:
        self.late = late
        self.held = False
        self.refused_bad = False
        self.current_holder: str | None = None
        self.api_answered: bool | None = None
        self.asked = 0
        self._reads = 0

    @property
    def unanswered(self) -> bool:
        self._reads += 1
        if self.late and self._reads > 1:  # answered by the time the restore is done
            self.api_answered = True
            return False
        return self.asked > 0

    def acquire(self, source_hash: str = "") -> bool:
        self.asked += 1
        return False

    def release(self, *, bad_hash: str | None = None) -> None:
        self.held = False

    def settle(self, timeout: float) -> bool:
        return False  # no answer within the confirm wait

    def wait_held(self, timeout: float) -> bool:
        return False

    def close(self, timeout: float) -> None:
        pass


def patched(tmp_path: Path) -> tuple[Files, Stopping]:
    root, src = helpers.node_folders(tmp_path)
    files = Files(source=src, host_root=root)
    engine.apply(files, engine.plan_apply(files), engine.state_store(files).load())
    return files, Stopping(files, engine.state_store(files), log_extra={})


def test_a_lease_answer_that_comes_late_is_a_slow_api_not_a_silent_one(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Under load the Lease's answer can take longer than the confirm wait: the restore goes ahead without it
    (it must follow SIGTERM within a second), but the API did answer, so the final report keeps the rest of
    the grace period instead of 2 s (``SILENT_API_REPORT``), which a loaded API server may need to take the
    Restored annotation."""
    files, stopper = patched(tmp_path)
    action = lifecycle.Restore("test", confirm_wait=0.0, turn_until=0.0, restored_until=0.0)
    with caplog.at_level(logging.WARNING):
        done = stopper.restore(action, engine.state_store(files).load(), SlowLease(late=True), None)
    assert done.ok and not done.api_silent
    assert (tmp_path / "node" / helpers.MANIFEST).read_bytes() == helpers.KUBEADM
    assert any("restoring without the rollout lease" in r.getMessage() for r in caplog.records)


def test_a_lease_request_never_answered_is_a_silent_api(tmp_path: Path) -> None:
    files, stopper = patched(tmp_path)
    action = lifecycle.Restore("test", confirm_wait=0.0, turn_until=0.0, restored_until=0.0)
    done = stopper.restore(action, engine.state_store(files).load(), SlowLease(late=False), None)
    assert done.ok and done.api_silent


class StalePods:
    """A mirror pod view that lost the API server (its watch does not follow it any more)."""

    fresh = False

    def latest(self) -> dict[str, object] | None:
        return None


def test_holding_the_turn_with_a_stale_pod_view_is_a_silent_api(tmp_path: Path) -> None:
    """The node held the turn (its own write waited for the restart) when the API went black: the restore does
    not ask for the turn, and the mirror pod's view is stale, so the API is silent, whatever an earlier round
    trip of the Lease actor said (its ``api_answered`` is from before the black hole). The final report then
    gets 2 s, not the rest of the grace period (the exit took 21 s in bench_black_hole(uninstall=True))."""
    files, stopper = patched(tmp_path)
    lease = SlowLease(late=False)
    lease.held, lease.api_answered = True, True
    action = lifecycle.Restore("test", confirm_wait=0.0, turn_until=0.0, restored_until=1e12)
    done = stopper.restore(action, engine.state_store(files).load(), lease, StalePods())
    assert done.ok and done.api_silent
