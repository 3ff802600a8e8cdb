"""The restart timeout and a stale mirror-pod view: a broken watch alone never decides a rollback."""

from __future__ import annotations

import pytest

from patcher.core import lifecycle
from patcher.core.restart import Verdict
from patcher.core.settings import Lifecycle
from patcher.core.state import State
from patcher.core.status import NodeState

HASH = "ab" * 32
OPTS = Lifecycle(restart_timeout=60.0, check_extenders=False)


def waiting() -> lifecycle.Node:
    record = State(phase=NodeState.WAITING_FOR_RESTART.value, config_hash=HASH, patched_sha256="cd" * 32)
    return lifecycle.Node(record=record, wait=lifecycle.Wait(HASH, written_ns=1, deadline=100.0))


def observe(now: float, *, blind: bool) -> tuple[lifecycle.Node, list[lifecycle.Action]]:
    return lifecycle.step(waiting(), lifecycle.Observed(now, 0, Verdict.WAITING, "not restarted yet", blind=blind),
                          OPTS)


def rolls_back(actions: list[lifecycle.Action]) -> bool:
    return any(isinstance(a, (lifecycle.RollBack, lifecycle.CheckLastGood)) for a in actions)


def test_a_fresh_view_past_the_deadline_rolls_back() -> None:
    node, actions = observe(100.0, blind=False)
    assert rolls_back(actions) and node.wait is None


@pytest.mark.parametrize("now", [100.0, 130.0, 159.9])
def test_a_stale_view_past_the_deadline_waits_one_more_timeout(now: float) -> None:
    node, actions = observe(now, blind=True)
    assert actions == [] and node == waiting()


def test_a_view_that_stays_stale_still_rolls_back_in_the_end() -> None:
    node, actions = observe(160.0, blind=True)
    assert rolls_back(actions) and node.wait is None


def test_before_the_deadline_staleness_changes_nothing() -> None:
    assert observe(50.0, blind=True) == observe(50.0, blind=False)
