"""The leader-aware order of the rollout turn (``lifecycle.order_wait``), on a model of a control plane.

Each node's agent is the real ``lifecycle.step``; the rest is a small model: the rollout Lease (one holder),
kube-scheduler's leader election (the leader's restart hands the lead to a Ready scheduler), each scheduler's
Ready, the Node annotations the agents publish. Hypothesis picks who plans when, which schedulers go unready,
which agents are dead, and how the clock moves. Safety: the leader's node is never written while another node
still has to change and could (its scheduler Ready), nor any node while no other scheduler is Ready; at most one
leader change per rollout. Liveness: every live agent's node is written, the leader's after the deadline at the
latest, however many peers never move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.core import lifecycle as lc
from patcher.core.restart import Verdict
from patcher.core.settings import Lifecycle
from patcher.core.state import State
from patcher.core.status import NodeState

OLD, NEW = "o" * 64, "n" * 64
H = "1" * 64


@dataclass
class Cluster:
    names: list[str]
    leader: str
    opts: Lifecycle
    dead: frozenset[str] = frozenset()
    fresh: bool = False  # an install: no agent has said anything yet
    now: float = 0.0
    agents: dict[str, lc.Node] = field(default_factory=dict)
    said: dict[str, tuple[str, str]] = field(default_factory=dict)  # the Node annotations: (state, source)
    unready: set[str] = field(default_factory=set)  # schedulers not Ready (crashed, or restarting)
    holder: str | None = None  # the rollout Lease
    restarting: str | None = None
    written: list[str] = field(default_factory=list)
    leader_changes: int = 0
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for n in self.names:
            record = State() if self.fresh else State(phase=NodeState.READY.value, source_hash=OLD)
            self.agents[n] = lc.Node(record=record)
            self.said[n] = ("", "") if self.fresh else (NodeState.READY.value, OLD)

    def view(self, me: str) -> lc.Schedulers:
        return lc.Schedulers(True, self.leader, self.leader == me, tuple(
            lc.Peer(n, *self.said[n], n not in self.unready) for n in self.names if n != me))

    def pending(self, n: str) -> bool:
        return n not in self.written

    def feed(self, n: str, event: lc.Event) -> list[lc.Action]:
        self.agents[n], acts = lc.step(self.agents[n], event, self.opts)
        node = self.agents[n]
        if node.phase is not None:
            self.said[n] = (node.phase.value, node.record.source_hash)
        return acts

    def plan(self, n: str) -> None:
        """The agent of ``n`` plans (a source change, its re-plan, a timer); a turn it gets is used at once."""
        if n in self.dead or not self.pending(n) or self.restarting == n:
            return
        acts = self.feed(n, self.planned(n))
        if any(isinstance(a, lc.ReleaseTurn) for a in acts) and self.holder == n:
            self.holder = None
        if not any(isinstance(a, lc.TakeTurn) for a in acts) and self.agents[n].turn != "held":
            return
        if self.holder not in (None, n):
            return
        self.holder = n
        self.feed(n, lc.TurnChanged(held=True, refused_bad=False))
        acts = self.feed(n, self.planned(n))  # the Replan
        if any(isinstance(a, lc.Apply) for a in acts):
            self.write(n)
        elif any(isinstance(a, lc.ReleaseTurn) for a in acts):
            self.holder = None

    def planned(self, n: str) -> lc.Planned:
        return lc.Planned(self.now, "pending", config_hash=H, config_file="c.yaml", source_hash=NEW,
                          manifest_change=True, schedulers=self.view(n))

    def write(self, n: str) -> None:
        expired = self.now >= self.opts.leader_wait
        others = [p for p in self.names if p != n]
        if others and not expired:
            if all(p in self.unready for p in others):
                self.violations.append(f"{n} written with no other scheduler Ready")
            waiting = [p for p in others if self.pending(p) and p not in self.unready and p not in self.dead]
            if n == self.leader and waiting:
                self.violations.append(f"leader {n} written while {waiting} still had to change")
        self.written.append(n)
        self.feed(n, lc.Wrote(self.now, State(config_hash=H, source_hash=NEW, manifest_mtime_ns=1), True))
        self.restarting = n
        self.unready.add(n)
        if n == self.leader:  # the lead goes to a Ready scheduler, if there is one
            ready = [p for p in others if p not in self.unready]
            self.leader = ready[0] if ready else ""
            self.leader_changes += 1

    def restarted(self) -> None:
        n = self.restarting
        if n is None:
            return
        self.restarting = None
        self.unready.discard(n)
        if not self.leader:
            self.leader = n
        acts = self.feed(n, lc.Observed(self.now, 0, Verdict.READY, "running"))
        assert any(isinstance(a, lc.ReleaseTurn) for a in acts) and self.holder == n
        self.holder = None


Step = tuple[str, int]
steps = st.lists(st.tuples(st.sampled_from(["plan", "restarted", "flap", "tick"]), st.integers(0, 3)),
                 max_size=60)


def cluster(size: int, leader: int, opts: Lifecycle, *, dead: frozenset[int] = frozenset(),
            fresh: bool = False) -> Cluster:
    names = [f"cp-{i}" for i in range(size)]
    return Cluster(names, names[leader % size], opts, frozenset(names[i] for i in dead if i < size), fresh)


def run(c: Cluster, script: list[Step]) -> None:
    for what, i in script:
        n = c.names[i % len(c.names)]
        if what == "plan":
            c.plan(n)
        elif what == "restarted":
            c.restarted()
        elif what == "flap" and n != c.restarting:  # a scheduler crashes, or comes back
            (c.unready.discard if n in c.unready else c.unready.add)(n)
        elif what == "tick":
            c.now += 10.0 * i


def finish(c: Cluster, rounds: int = 40) -> None:
    """A fair end: every scheduler back, every live agent plans in turn, restarts finish, the clock moves."""
    c.unready = {c.restarting} if c.restarting else set()
    for _ in range(rounds):
        c.restarted()
        for n in c.names:
            c.plan(n)
        c.now += c.opts.leader_wait / 4 if math.isfinite(c.opts.leader_wait) else 1.0


SAFE = Lifecycle(coordinated=True, check_extenders=False, leader_wait=math.inf)
LIVE = Lifecycle(coordinated=True, check_extenders=False, leader_wait=300.0)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 4), leader=st.integers(0, 3), fresh=st.booleans(), script=steps)
def test_the_leader_goes_last_and_never_without_another_ready_scheduler(size: int, leader: int, fresh: bool,
                                                                        script: list[Step]) -> None:
    c = cluster(size, leader, SAFE, fresh=fresh)
    run(c, script)
    finish(c)
    assert c.violations == []
    assert sorted(c.written) == c.names  # all live, no deadline needed
    if size > 1 and all(what != "flap" for what, _ in script):  # (an unready peer may be passed: not "could")
        assert c.written[-1] == c.names[leader % size]
        assert c.leader_changes == 1


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 4), leader=st.integers(0, 3), dead=st.frozensets(st.integers(0, 3), max_size=3),
       fresh=st.booleans(), script=steps)
def test_every_live_node_is_written_in_the_end_whatever_the_others_do(size: int, leader: int, dead: frozenset[int],
                                                                      fresh: bool, script: list[Step]) -> None:
    c = cluster(size, leader, LIVE, dead=dead, fresh=fresh)
    run(c, script)
    finish(c)
    assert sorted(c.written) == sorted(set(c.names) - c.dead)
    assert len(c.written) == len(set(c.written))
    assert c.violations == []


def test_a_held_back_leader_says_why_once_and_gives_a_turn_back() -> None:
    c = cluster(2, 0, LIVE)
    c.agents["cp-0"] = replace(c.agents["cp-0"], turn="asked")
    acts = c.feed("cp-0", c.planned("cp-0"))
    assert acts == [lc.Count("reconciled"),
                    lc.Log("info", "rollout turn held back: this node's kube-scheduler leads: cp-1 change first"),
                    lc.ReleaseTurn(), lc.RetryLater(300.0)]
    assert c.agents["cp-0"].order == (0.0, "this node's kube-scheduler leads: cp-1 change first")
    c.now = 100.0
    assert c.feed("cp-0", c.planned("cp-0")) == [lc.Count("reconciled"), lc.RetryLater(200.0)]
    c.now = 300.0  # the deadline: said once, then asked as before
    acts = c.feed("cp-0", c.planned("cp-0"))
    assert acts[1] == lc.Log("warning", "this node's kube-scheduler leads: cp-1 change first; going on after 300s "
                                        "of leader-aware order")
    assert acts[-1] == lc.TakeTurn(NEW)
    assert c.feed("cp-0", c.planned("cp-0"))[-1] == lc.TakeTurn(NEW)


def test_without_a_view_a_leader_or_a_peer_the_turn_is_asked_as_before() -> None:
    peer = lc.Peer("cp-1", "", "", True)
    for view in (lc.Schedulers(), lc.Schedulers(True, "", False, (peer,)), lc.Schedulers(True, "cp-0", True)):
        assert lc.order_wait(view, NEW) == ""
    assert lc.order_wait(lc.Schedulers(True, "cp-0", True, (replace(peer, ready=False),)), NEW) == (
        "no kube-scheduler on another control-plane node is Ready to take the lead over")
    # a peer that is done, failed or held does not hold the leader back; one Ready on the old source does
    for state, source, waits in (("Ready", NEW, False), ("Failed", OLD, False), ("RolledBack", OLD, False),
                                 ("Held", OLD, False), ("Ready", OLD, True), ("Pending", NEW, True), ("", "", True)):
        view = lc.Schedulers(True, "cp-0", True, (lc.Peer("cp-1", state, source, True),))
        assert bool(lc.order_wait(view, NEW)) is waits, (state, source)


def test_a_write_waiting_for_its_restart_keeps_its_turn_whatever_the_order() -> None:
    c = cluster(2, 0, LIVE)
    c.holder = "cp-0"
    c.agents["cp-0"] = replace(c.agents["cp-0"], turn="held", wait=lc.Wait(H, 1, 100.0, NEW))
    acts = c.feed("cp-0", lc.Planned(0.0, "pending", config_hash="2" * 64, config_file="d.yaml", source_hash=NEW,
                                     manifest_change=True, schedulers=c.view("cp-0")))
    assert not any(isinstance(a, lc.ReleaseTurn) for a in acts) and lc.Apply() in acts
    assert c.agents["cp-0"].turn == "held"


# -- the uninstall: every agent stops at once, the leader's node restores last (``lifecycle.stop_order_wait``) --


@dataclass
class Uninstall:
    """Every agent got its SIGTERM at the same time (the DaemonSet deleted); each restore takes the rollout Lease,
    restarts its scheduler for ``restart`` ticks, says Restored and releases the Lease. The leader's agent asks
    only while ``stop_order_wait`` on its view lets it, or once its turn's deadline passed. ``dead``: agents
    that never restore (their node down), whose Nodes keep saying Ready."""

    names: list[str]
    leader: str
    dead: frozenset[str]
    restart: int
    turn_deadline: int
    said: dict[str, str] = field(default_factory=dict)
    holder: str | None = None
    restarting: dict[str, int] = field(default_factory=dict)  # node -> ticks left
    restored: list[str] = field(default_factory=list)
    leader_changes: int = 0
    now: int = 0

    def view(self, me: str) -> lc.Schedulers:
        return lc.Schedulers(True, self.leader, self.leader == me, tuple(
            lc.Peer(n, self.said.get(n, NodeState.READY.value), "", n not in self.restarting)
            for n in self.names if n != me))

    def may_ask(self, n: str) -> bool:
        return n not in self.dead and n not in self.restored and n not in self.restarting and (
            not lc.stop_order_wait(self.view(n)) or self.now >= self.turn_deadline)

    def tick(self, order: list[int]) -> None:
        for n, left in list(self.restarting.items()):
            if left > 1:
                self.restarting[n] = left - 1
                continue
            del self.restarting[n]
            self.said[n], self.holder = NodeState.RESTORED.value, None
            self.restored.append(n)
        for i in order:  # who asks first this tick: hypothesis's order
            n = self.names[i % len(self.names)]
            if self.holder is None and self.may_ask(n):
                self.holder, self.restarting[n] = n, self.restart
                if n == self.leader:  # its clean stop hands the lead to a scheduler that runs
                    ready = [p for p in self.names if p not in self.restarting]
                    if ready:
                        self.leader, self.leader_changes = ready[0], self.leader_changes + 1
        self.now += 1


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 5), leader=st.integers(0, 4), dead=st.frozensets(st.integers(0, 4), max_size=2),
       restart=st.integers(1, 4), orders=st.lists(st.permutations(range(5)), min_size=1, max_size=60))
def test_an_uninstall_restores_the_leaders_node_last_and_moves_the_lead_once(
        size: int, leader: int, dead: frozenset[int], restart: int, orders: list[list[int]]) -> None:
    names = [f"cp-{i}" for i in range(size)]
    dead_names = frozenset(names[i] for i in dead if i < size) - {names[leader % size]}
    u = Uninstall(names, names[leader % size], dead_names, restart, turn_deadline=(size - 1) * restart + 10)
    first = u.leader
    for t in range(200):
        u.tick(orders[t % len(orders)])
    assert sorted(u.restored) == sorted(set(names) - dead_names)  # everyone alive restores, the leader too
    assert len(u.restored) == len(set(u.restored))
    if not dead_names:
        assert u.restored[-1] == first and u.leader_changes == (1 if size > 1 else 0)
