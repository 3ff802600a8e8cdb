"""The agent is an executor. Each lifecycle event is stepped from one local queue: no action
feeds the step itself (an action that observes something returns its event), each transition saves the record
once, and a re-plan is its own loop event, not a manifest event in disguise.

Driven step by step (no loop thread) on real folders, with the stateful test's kubelet as the mirror pod.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest

from patcher.core import lifecycle
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files, Lifecycle
from patcher.core.state import State
from patcher.services import nodefiles
from patcher.services.agent import Agent
from tests.component.test_lifecycle_stateful import FakeKubelet
from tests.harness import helpers
from tests.harness.settings import build_settings

SECOND = "extenders:\n- urlPrefix: http://127.0.0.1:8890\n  filterVerb: filter\n  weight: 1\n"


def executing() -> bool:
    """An action of the agent is being executed further up this thread's stack."""
    return any(frame.function == "_execute" for frame in inspect.stack(0))


class Granting:
    """A rollout Lease actor whose turn is free: every ask is granted at once (the Coordinator protocol)."""

    held = False
    refused_bad = False
    current_holder: str | None = None
    api_answered: bool | None = True
    unanswered = False
    denied: str | None = None

    def acquire(self, source_hash: str = "") -> bool:
        self.held = True
        return True

    def release(self, *, bad_hash: str | None = None) -> None:
        self.held = False

    def settle(self, timeout: float) -> bool:
        return self.held

    def wait_held(self, timeout: float) -> bool:
        return self.held

    def close(self, timeout: float) -> None:
        pass


def test_every_transition_is_stepped_and_saved_from_the_queue_once(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A first config to Ready, then a second one to Ready (which prunes the first): no step and no save of
    the record happens inside an action, and each transition that changes the record saves it once. Before,
    an apply, a rollback or a restart check fed the step from inside the action that observed it, and the
    transition to Ready saved the record twice (before its actions, and again after the prune)."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1",
                                 restart_timeout=3600.0, restart_settle=0.0, check_extenders=False), pods=kubelet)
    steps: list[tuple[bool, bool]] = []  # (record changed, stepped inside an action)
    saves: list[bool] = []  # saved inside an action
    real_step, real_save = lifecycle.step, agent.record.store.save

    def step(node: lifecycle.Node, event: lifecycle.Event, opts: Lifecycle, **kw: str) -> lifecycle.Step:
        after, actions = real_step(node, event, opts, **kw)
        steps.append((after.record != node.record, executing()))
        return after, actions

    def save(record: State) -> None:
        saves.append(executing())
        real_save(record)

    monkeypatch.setattr(lifecycle, "step", step)
    monkeypatch.setattr(agent.record.store, "save", save)
    agent.start()
    kubelet.sync()  # the scheduler runs the first config
    agent.notify(LoopEvent.POD)  # what a mirror pod update does
    assert agent.turn() is LoopEvent.POD
    assert agent.node.record.phase == "Ready"
    first, first_files = agent.node.record.config_hash, agent.node.record.files
    (src / "extenders.yaml").write_text(SECOND)
    agent.reconcile("source changed")
    kubelet.sync()
    agent.notify(LoopEvent.POD)  # what a mirror pod update does
    assert agent.turn() is LoopEvent.POD
    assert agent.node.record.phase == "Ready" and agent.node.record.config_hash != first
    gone = [f for f in first_files if f not in agent.node.record.files]
    fs = nodefiles.host_fs(agent.files)
    assert gone and not any(fs.local(f"{agent.files.host_config_dir}/{f}").exists() for f in gone)
    assert not any(inside for _, inside in steps), "a step was fed from inside an action"
    assert not any(saves), "the record was saved from inside an action"
    # one save per transition that changed the record, and the first one's, which proves the state folder
    assert len(saves) == 1 + sum(changed for changed, _ in steps[1:])


def test_a_turn_granted_at_once_replans_through_its_own_loop_event(tmp_path: Path) -> None:
    """The step's ``Replan`` (here: the turn came) is the loop's "replan" event, which plans again; before,
    it was put on the queue as a "manifest" event, as if the kubelet's folder had changed."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1",
                                 restart_timeout=3600.0, restart_settle=0.0, check_extenders=False),
                  pods=kubelet, coordinator=Granting(), coordinated=True)
    agent.start()
    assert agent.node.turn == "held" and agent.node.record.phase == "Pending"  # the turn came: nothing written yet
    assert agent.turn() is LoopEvent.REPLAN and agent.events.empty()  # it was the one event on the queue
    assert agent.node.record.phase == "WaitingForRestart" and b"--config=" in (root / helpers.MANIFEST).read_bytes()


def test_every_loop_event_has_its_branch(tmp_path: Path) -> None:
    """Each event an adapter can send reaches the step without an internal error (the mirror pod's "pod" runs
    the restart check and a due timer; the stop's own event ends the loop before it is handled)."""
    root, src = helpers.node_folders(tmp_path)
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1",
                                 check_extenders=False))
    agent.start()
    for event in LoopEvent:
        if event is not LoopEvent.PROBE:  # its answer comes with it: test_agent_preflight
            agent.notify(event)
            while agent.turn() is not event:  # after what the events before it put on the queue
                pass
    assert agent.node.phase is not None and agent.metrics.render().count(b'kind="internal"') == 0


def test_the_verdict_is_republished_when_a_ready_node_gains_or_loses_its_message(tmp_path: Path) -> None:
    """A Ready node whose extender stopped answering stays Ready and carries a message, which turns the cluster
    verdict NotReady: the publisher must hear of it though the phase did not change (the real API server showed
    the published verdict staying Ready for minutes, tests/real/test_real_scheduler.py)."""
    root, src = helpers.node_folders(tmp_path)
    kubelet = FakeKubelet(root)
    kubelet.sync()
    heard: list[str] = []
    agent = Agent(build_settings(files=Files(source=src, host_root=root), node_name="cp-1",
                                 restart_timeout=3600.0, restart_settle=0.0, check_extenders=False), pods=kubelet,
                  on_phase=lambda phase: heard.append(phase.value))
    agent.start()
    kubelet.sync()
    agent.notify(LoopEvent.POD)  # what a mirror pod update does
    assert agent.turn() is LoopEvent.POD
    assert agent.node.record.phase == "Ready"
    heard.clear()
    config = agent.node.record.config_hash

    def periodic_probe(blocking: str = "") -> None:
        """The periodic probe of the running config (its timer set `probing`), answered."""
        agent.node = replace(agent.node, probing=config, periodic=True)
        agent.world.probe_done(lifecycle.Probed(config_hash=config, blocking=blocking))
        assert agent.turn() is LoopEvent.PROBE

    periodic_probe("extender http://x/filter: refused")
    assert agent.node.record.phase == "Ready" and agent.node.record.message and heard == ["Ready"]
    periodic_probe()
    assert agent.node.record.message is None and heard == ["Ready", "Ready"]
    periodic_probe()  # nothing changed: nothing to say
    assert heard == ["Ready", "Ready"]
