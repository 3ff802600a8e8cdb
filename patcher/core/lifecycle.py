"""The node's patch lifecycle as one pure function: ``step(node, event, opts) -> (node, actions)``.

The protocol is kubeadm's static-pod upgrade with a turn taken first: prove the extenders answer (pre-flight),
take the turn (rollout Lease; the node whose kube-scheduler leads goes last: ``order_wait``), write the manifest,
wait for the kubelet to restart the scheduler onto it, then Ready or roll back (to the last Ready config, else the
original), and release the turn. On SIGTERM (``Stop``) restore exactly our changes when the agent leaves the node
for good, keep them when its DaemonSet still wants a pod here (``stop``). No I/O: the executor feeds in what it saw
and executes what comes back. The phase lives only in ``node.record.phase``, so ``/readyz``, the state record and
the annotations can never disagree.

Three edges hold everything else back (``_gate``): a state folder that cannot take the record (a write that is
not recorded cannot be undone: Failed, retried with a doubling delay), the operator's hold (``<prefix>/hold``:
no write, no turn, the writer lock let go for a hand ``restore``; while an API agent does not know the hold yet,
as if held), and the stop. A ``--config`` naming a missing file the plan does not write back is a Failed of its
own, said until the file is back (``with_missing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from patcher.core.manifestedit import MISSING_FILE
from patcher.core.restart import Verdict
from patcher.core.settings import Lifecycle
from patcher.core.state import LastGood, State
from patcher.core.status import NodeState

Level = Literal["info", "warning", "error"]
StopWhy = Literal["signal", "api-unavailable"]
#: The counters of ``Count`` (one method each on ``patcher.adapters.health.Metrics``).
Counter = Literal["reconciled", "wrote", "rolled_back", "restored"]
#: The label of ``Error`` (``patcher_errors_total{kind=...}``).
ErrorKind = Literal["config", "manifest", "write", "extender", "rollback", "state", "restore"]

#: Seconds a stop waits for the API to answer one request for the rollout Lease before restoring without it:
#: at most 40 % of the grace period, the share the whole wait for the turn may take. A lone stop: no other node
#: restores at the same time, so a silent API costs this much and no more.
LEASE_CONFIRM_WAIT = 0.3
#: Seconds the first request of the stop may take when every agent leaves (an uninstall: all of them ask at the
#: same moment). An answer that slow is a loaded control plane, not a silent one (the API's own objective for a
#: single-object call is 1 s, and a request for the turn is a read and a write). Taken for silence, it restarted
#: all three schedulers at once when the first asks of three real nodes' uninstall took longer than
#: ``LEASE_CONFIRM_WAIT``. At most 40 % of the grace period, as the turn's wait.
LEASE_ANSWERED_WAIT = 2.0
#: Seconds each later request of the stop may take once the API answered it: the per-request timeout the
#: schedulers' own leader election gives a Lease request (client-go's ``?timeout=5s``). 2 s took a loaded control
#: plane for a silent one: an uninstall's last agent, held back behind the leader's peers, restored without the
#: turn while another node's scheduler was restarting (two at once, on three real kubeadm nodes under CI's load).
#: At most 40 % of the grace period, as the turn's wait.
LEASE_LATER_WAIT = 5.0
#: Seconds a stop with ``auto`` gives a fresh read of the DaemonSet and the Node (what the watch saw stands
#: when no answer comes).
OWNER_LOOKUP = 0.15
#: Seconds from the stop to the end of its last wait for an answer: SIGTERM -> exit within a second whatever the
#: API does. Only waits on an API that answers (another node holds the turn) may take the grace period's share, and
#: an uninstall's first ask for the turn its ``LEASE_ANSWERED_WAIT``.
STOP_ANSWERS = 0.45
#: Seconds the release and the final report get after such a wait on an answering API.
FINAL_REPORT = 0.5
#: Seconds between two plans while a write is held back for the node's kubelet (``Planned.kubelet_down``).
KUBELET_RETRY = 5.0


# -- the value -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """The write we are waiting on. ``deadline`` is on the monotonic clock of this process (not persisted: an
    adopted wait gets a full timeout from its adoption, since time the agent was down says nothing)."""

    config_hash: str
    written_ns: int
    deadline: float
    source_hash: str = ""
    adopted: bool = False
    #: The extenders answered again after the restart (the canary probe): only then is the node Ready and the
    #: rollout turn passed on.
    extenders_checked: bool = False
    probing: bool = False  # that probe runs now (a pre-flight of the next config may run beside it)
    #: Why the node's kubelet was not healthy when this wait was past its deadline ("": never seen so): a
    #: timeout is then no verdict on the config (``observed``).
    kubelet_down: str = ""


@dataclass(frozen=True)
class Fault:
    """The state folder cannot take the record. ``message`` names the folder and the kernel's answer;
    ``phase``/``phase_message`` are what the node said before, said again once the folder works."""

    message: str
    failures: int
    phase: str
    phase_message: str | None


@dataclass(frozen=True)
class Missing:
    """``--config`` names a missing file the plan does not write back: the scheduler's next start fails.
    ``phase``/``phase_message``: what the node would say without it (empty: not known since a restart)."""

    message: str
    phase: str
    phase_message: str | None

    @property
    def said(self) -> str:
        """The missing file first (the most urgent news), then a failure the node would say without it."""
        also = self.phase_message if self.phase == NodeState.FAILED.value and self.phase_message else ""
        return f"{self.message}; also: {also}" if also else self.message


@dataclass(frozen=True)
class Node:
    record: State = field(default_factory=State)
    wait: Wait | None = None
    turn: Literal["none", "asked", "held"] = "none"
    stopping: bool = False
    stop_until: float = 0.0  # set by Stop: when the release and the final report must be done (monotonic)
    grace_until: float = 0.0  # set by Stop: the grace period's end, less the exit's reserve (monotonic)
    #: The pre-flight: the config probed now, the last one that passed, failures in a row (the backoff).
    probing: str = ""
    #: That probe is the periodic one of a Ready node (``probe_due``), not a pre-flight: a Ready node whose
    #: manifest lost the patch (kubeadm rewrote it while the node was held, or while the agent was down) plans
    #: the config it runs, and that pre-flight's answer must lead to the write.
    periodic: bool = False
    probed: str = ""
    probe_failures: int = 0
    failed_probe: str = ""  # the config those failures were for
    fault: Fault | None = None  # the state folder cannot take the record: nothing but its retry happens
    missing: Missing | None = None  # a --config names a missing file the plan does not write back
    hold: str | None = None  # the ``<prefix>/hold`` annotation's value (may be empty); None: not held
    #: False from an API agent's start until the hold watch answered or its wait ran out: nothing is written
    #: (the node may have been held and restored by hand before this agent started).
    hold_known: bool = True
    #: The leader-aware order held this write back: since when (monotonic; the deadline counts from it) and why
    #: ("" once it let the write go). None until it first held this write back; cleared when a wait starts.
    order: tuple[float, str] | None = None
    #: A write held back because the node's kubelet is not healthy: why, as said once ("": not held back).
    kubelet_held: str = ""

    @property
    def phase(self) -> NodeState | None:
        return NodeState(self.record.phase) if self.record.phase else None


# -- events (what the agent observed) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Resumed:
    """The agent (re)started with this record loaded from disk."""

    now: float


@dataclass(frozen=True)
class Peer:
    """Another control-plane node: what its agent says on its Node (``state``, ``source-hash``; "" when it says
    nothing) and whether its kube-scheduler could take the lead over (its mirror pod Ready)."""

    node: str
    state: str = ""
    source_hash: str = ""
    ready: bool = False


@dataclass(frozen=True)
class Schedulers:
    """kube-scheduler's leader election as the agent sees it (``adapters/kube/schedleader``): ``leader`` is the
    node whose scheduler holds ``kube-system/kube-scheduler`` ("" when none is known), ``leads`` whether it is
    this one. ``known`` False: not read (no API, RBAC missing, not listed yet): the order is not applied."""

    known: bool = False
    leader: str = ""
    leads: bool = False
    peers: tuple[Peer, ...] = ()


@dataclass(frozen=True)
class Planned:
    """What a plan of the source against the manifest found (``nodefiles.plan_apply``), reduced to data."""

    now: float
    kind: Literal["refused", "known-bad", "up-to-date", "pending"]
    message: str = ""  # the refusal, one line
    error_kind: ErrorKind = "config"  # metrics label of a refusal
    config_hash: str = ""
    config_file: str = ""
    api_version: str = ""
    files: tuple[str, ...] = ()
    source_hash: str = ""
    manifest_change: bool = False  # pending: the manifest itself changes (else only config files)
    current_sha256: str = ""  # up-to-date: the manifest as it is (carries our patch)
    unpatched_sha256: str = ""
    mtime_ns: int = 0
    missing: str = ""  # the ``--config`` names a file not on the node that this plan does not put back
    schedulers: Schedulers = field(default_factory=Schedulers)  # the leader-aware order's view at the plan
    #: pending: why the node's kubelet is not healthy now ("": healthy, or not known); nothing is written then.
    kubelet_down: str = ""


@dataclass(frozen=True)
class Wrote:
    """The planned write went through; ``record`` is the new record ``nodefiles.apply`` wrote."""

    now: float
    record: State
    manifest_change: bool


@dataclass(frozen=True)
class WriteFailed:
    message: str
    changed_underneath: bool  # someone wrote the manifest between our plan and our write: plan again


@dataclass(frozen=True)
class Observed:
    """The restart checks' combined verdict on the write we wait for (mirror pod and/or local process)."""

    now: float
    wall_ns: int
    verdict: Verdict
    reason: str
    blind: bool = False  # the only check is a mirror-pod view that does not follow the server right now
    #: Why the node's kubelet is not healthy now ("": healthy, or not known; looked at only past the deadline):
    #: no kubelet, no restart, so the timeout says nothing about the config.
    kubelet_down: str = ""
    #: Waiting only for the settle time, done then (monotonic): a healthy scheduler that started just before
    #: the deadline is not rolled back for it.
    settle_until: float | None = None


@dataclass(frozen=True)
class TurnChanged:
    """The Lease actor's snapshot: the turn is ours, or the source was rolled back elsewhere (``config_hash``,
    the planned config, is then marked bad here)."""

    held: bool
    refused_bad: bool
    config_hash: str = ""


@dataclass(frozen=True)
class Pruned:
    """The previous config's files are removed; ``record`` no longer lists them."""

    record: State


@dataclass(frozen=True)
class LastGoodChecked:
    """The answer to ``CheckLastGood``: ``fits`` (its files read back, its plan made from the same unpatched
    manifest it ran with), else ``why`` not."""

    check: CheckLastGood
    fits: bool
    why: str = ""


@dataclass(frozen=True)
class RollbackDone:
    """The report of a ``RollBack``: the new ``record`` and its ``target``, or (``record`` None) the error."""

    reason: str
    bad_source: str
    record: State | None = None
    target: str = ""  # "the last Ready config <hash>" or "the original manifest"
    error: str = ""


@dataclass(frozen=True)
class Probed:
    """A probe of ``config_hash`` finished: the extenders that did not answer, not ignorable (``blocking``) and
    ignorable (``ignored``), one line each."""

    config_hash: str
    blocking: str = ""
    ignored: str = ""


@dataclass(frozen=True)
class ProbeDue:
    """The periodic probe's timer: while Ready, prove the extenders still answer."""


@dataclass(frozen=True)
class DaemonSetView:
    """What the agent knows of the DaemonSet that owns its pod. ``known``: the API answered about it since the
    start (a 404 too); the rest means something only then. ``selects``: its pod template still fits this node."""

    known: bool = False
    exists: bool = False
    deleting: bool = False  # metadata.deletionTimestamp is set
    selects: bool = False
    name: str = ""
    detail: str = ""  # why it does not select this node, or why it is unknown (for the log)

    def successor(self) -> str | None:
        """Why a successor pod will come to this node; None when none will (or it cannot be known)."""
        if self.known and self.exists and not self.deleting and self.selects:
            return f"DaemonSet {self.name} still selects this node"
        return None

    def gone(self) -> str:
        """Why no successor comes (when ``successor()`` is None)."""
        if not self.known:
            return f"cannot tell whether a successor comes ({self.detail or 'no answer about the DaemonSet'})"
        if not self.exists:
            return f"DaemonSet {self.name or '?'} is gone" + (f" ({self.detail})" if self.detail else "")
        if self.deleting:
            return f"DaemonSet {self.name} is being deleted"
        return f"DaemonSet {self.name} no longer selects this node ({self.detail or 'not selected'})"


@dataclass(frozen=True)
class Stop:
    """SIGTERM/SIGINT or a stop request at ``now`` (monotonic); ``daemonset`` is read by ``auto`` only."""

    now: float = 0.0
    why: StopWhy = "signal"
    daemonset: DaemonSetView = field(default_factory=DaemonSetView)


@dataclass(frozen=True)
class RestoreDone:
    """The report of a ``Restore``: ``ok`` (the manifest carries nothing of ours), else the error."""

    ok: bool
    message: str = ""
    held: bool = False  # the executor holds the rollout turn it took for the restore
    now: float = 0.0
    api_silent: bool = False  # the API did not answer the stop (its Lease request, or the mirror pod's watch)


@dataclass(frozen=True)
class StateFolderFailed:
    """The state folder refused the record (its save, the write carrying it, or the writer lock); nothing was
    written. ``message`` names the folder and the kernel's answer."""

    message: str


@dataclass(frozen=True)
class StateFolderOk:
    """The retry saved the record: the state folder works again."""


@dataclass(frozen=True)
class HoldChanged:
    """The hold annotation as the watch last saw it (may be empty); None when absent."""

    hold: str | None


@dataclass(frozen=True)
class HoldUnknown:
    """The hold watch did not answer within ``waited`` seconds of the start: go on as not held."""

    waited: float


@dataclass(frozen=True)
class Reclaimed:
    """The hold is gone and the executor took the writer lock back: ``record`` is the state record as it is on
    disk now (a hand ``restore`` during the hold cleared it)."""

    now: float
    record: State


Event = (Resumed | Planned | Wrote | WriteFailed | Observed | TurnChanged | Pruned | LastGoodChecked | RollbackDone
         | Probed | ProbeDue | Stop | RestoreDone | StateFolderFailed | StateFolderOk | HoldChanged | HoldUnknown
         | Reclaimed)


class LoopEvent(StrEnum):
    """What wakes the agent's loop (``services/observations`` turns each into the events above)."""

    SOURCE = "source"  # the source folder changed
    MANIFEST = "manifest"  # the kubelet's manifest folder (or a symlinked manifest's target folder) changed
    CONFIG = "config"  # the host config folder changed
    POD = "pod"  # the mirror pod's view changed
    LEASE = "lease"  # the Lease actor's snapshot changed
    DAEMONSET = "daemonset"  # what the agent knows of its DaemonSet changed
    HOLD = "hold"  # the Node's hold annotation changed
    ATTACHED = "attached"  # the API adapters are there
    PROBE = "probe"  # an extender probe answered
    REPLAN = "replan"  # the step's ``Replan``: plan again
    STOP = "stop"  # a stop was requested


# -- actions (what the agent must do) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Apply:
    """Write the plan that was just planned."""


@dataclass(frozen=True)
class TakeTurn:
    source_hash: str


@dataclass(frozen=True)
class ReleaseTurn:
    bad_source: str | None = None


@dataclass(frozen=True)
class Watch:
    """Start judging the restart onto the current write (a fresh restart baseline, a local tracker)."""


@dataclass(frozen=True)
class CheckLastGood:
    """Before a rollback to ``last_good``: read its files back and plan it; report with ``LastGoodChecked``."""

    reason: str
    bad_source: str
    last_good: LastGood


@dataclass(frozen=True)
class RollBack:
    """Go back to ``target``; report with ``RollbackDone``."""

    reason: str
    bad_source: str
    last_good: LastGood | None
    target: Literal["last-good", "original"] = "original"


@dataclass(frozen=True)
class Prune:
    """Remove the previous config's files; report with ``Pruned`` (nothing when it failed: tried again later)."""


@dataclass(frozen=True)
class Publish:
    reason: str | None = None


@dataclass(frozen=True)
class Note:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Log:
    level: Level
    message: str


@dataclass(frozen=True)
class Count:
    name: Counter


@dataclass(frozen=True)
class Error:
    kind: ErrorKind


@dataclass(frozen=True)
class RestartSeen:
    """The scheduler ran our write ``seconds`` after it (the restart histogram)."""

    seconds: float


@dataclass(frozen=True)
class Replan:
    """Plan again now: the plan's ``Planned`` is the next event."""


@dataclass(frozen=True)
class Probe:
    """Probe the extenders of ``config_hash`` in the background; the answer comes back as ``Probed``."""

    config_hash: str


@dataclass(frozen=True)
class RetryLater:
    """In ``delay`` seconds, plan again (a failed pre-flight, the end of the leader-aware order's wait) or save
    the record again (``StateFolderOk`` or ``StateFolderFailed``)."""

    delay: float
    timer: Literal["probe-retry", "state-folder"] = "probe-retry"


@dataclass(frozen=True)
class Restore:
    """Restore the manifest and remove our files; report with ``RestoreDone``. When the restore writes the
    manifest, first ask for the rollout Lease (one scheduler restart at a time): a request unanswered within
    ``confirm_wait`` (``answered_wait`` once one was answered; the step gives the first one that too when every
    agent leaves) means no scheduler schedules anyway, restore at once; another holder: ask again until
    ``turn_until``. Holding it, wait until ``restored_until`` for the restored scheduler (monotonic bounds)."""

    confirm_wait: float
    turn_until: float
    restored_until: float
    #: Every agent leaves (the DaemonSet is gone or being deleted): a node whose kube-scheduler leads lets the
    #: others restore first (``stop_order_wait`` on the live view), as the rollout does.
    leader_last: bool = False
    #: The wait for each later request once one was answered (``LEASE_LATER_WAIT``; never below ``confirm_wait``).
    answered_wait: float = 0.0


@dataclass(frozen=True)
class Finish:
    """The stop's last action: close the Lease and send the pending report before ``until``, then exit with
    ``code``. While the API client is still being built, wait for it until ``build_until`` at most."""

    until: float
    code: int = 0
    build_until: float = 0.0


@dataclass(frozen=True)
class LetGo:
    """The node is held: release the writer lock (a hand ``restore`` may run)."""


@dataclass(frozen=True)
class Reclaim:
    """The hold is gone: take the writer lock back and read the record from disk; report with ``Reclaimed``."""


Action = (Apply | TakeTurn | ReleaseTurn | Watch | CheckLastGood | RollBack | Prune | Publish | Note | Log | Count
          | Error | RestartSeen | Replan | Probe | RetryLater | Restore | Finish | LetGo | Reclaim)
Step = tuple[Node, list[Action]]


# -- transitions ---------------------------------------------------------------------------------------------


def _phase(node: Node, phase: NodeState, message: str | None = None, *, reason: str | None = None,
           record: State | None = None, after: Sequence[Action] = ()) -> tuple[Node, list[Action]]:
    """Enter ``phase``: the record changes (the executor saves it once) and the annotations follow ``after``."""
    base = record if record is not None else node.record
    changed = phase.value != node.record.phase or message != node.record.message
    new = replace(node, record=replace(base, phase=phase.value, message=message))
    return new, [*after, *([Publish(reason)] if changed or phase == NodeState.READY else [])]


def _backoff(first: float, most: float, failures: int) -> float:
    """The delay before the next try: ``first`` after one failure, doubling with each, ``most`` at most."""
    return min(most, first * 2.0 ** (failures - 1))


def _release(node: Node, bad_source: str | None = None, after: Sequence[Action] = ()) -> Step:
    if node.turn == "none":
        return node, [*after]
    return replace(node, turn="none"), [*after, ReleaseTurn(bad_source or None)]


def _start_wait(node: Node, opts: Lifecycle, record: State, now: float, *, adopted: bool) -> Step:
    wait = Wait(record.config_hash, record.manifest_mtime_ns, now + opts.restart_timeout, record.source_hash, adopted)
    node2, acts = _phase(replace(node, wait=wait, order=None), NodeState.WAITING_FOR_RESTART,
                         reason="SchedulerAdopted" if adopted else None, record=record)
    return node2, [*acts, Watch()]


def resumed(node: Node, ev: Resumed, opts: Lifecycle) -> Step:
    """After a crash or restart of the agent: pick up a write still waiting for the scheduler; a Ready,
    Failed or RolledBack record stands as it is (and with it /readyz)."""
    r = node.record
    if r.phase == NodeState.WAITING_FOR_RESTART and r.patched:
        acts: list[Action] = []
        if opts.coordinated:
            node, acts = replace(node, turn="asked"), [TakeTurn("")]  # still ours after a crash: keep it
        node, more = _start_wait(node, opts, r, ev.now, adopted=True)
        return node, [*acts, *more]
    if r.phase in (NodeState.READY, NodeState.ROLLED_BACK, NodeState.FAILED):
        return node, []
    return replace(node, record=replace(r, phase="")), []


def planned(node: Node, ev: Planned, opts: Lifecycle) -> Step:
    acts: list[Action] = [Count("reconciled")]
    if node.kubelet_held and not (ev.kind == "pending" and ev.manifest_change):
        node = replace(node, kubelet_held="")  # nothing to hold back any more: a later outage is said again
    r = node.record
    was_ready = r.last_good is not None and r.last_good.config_hash == ev.config_hash  # it ran Ready here before
    if ev.kind == "known-bad":
        return node, [*acts, Log("info", f"not retrying a config that was rolled back: {ev.message}")]
    if ev.kind == "refused":
        acts += [Error(ev.error_kind), Log("error", ev.message)]
        if node.wait is not None:  # the write we wait for stands; the refusal is about the next one
            return node, acts
        return _phase(node, NodeState.FAILED, f"{ev.message}; nothing was changed", after=acts)
    if ev.kind == "up-to-date":
        if node.phase not in (None, NodeState.FAILED, NodeState.PENDING) or node.wait is not None:
            return node, acts
        # The manifest already carries our current patch: a restarted agent, or a source fixed after Failed.
        adopted = replace(r, config_hash=ev.config_hash, config_file=ev.config_file, api_version=ev.api_version,
                          files=ev.files, patched_sha256=ev.current_sha256, original_sha256=ev.unpatched_sha256,
                          source_hash=ev.source_hash)
        if was_ready:
            # This very config was confirmed Ready here before (e.g. the source had a typo meanwhile, which
            # was refused without touching anything): the scheduler still runs it, nothing to wait for.
            return _phase(node, NodeState.READY, record=adopted, after=[*acts, Log(
                "info", f"manifest carries config {ev.config_hash[:12]}, which was Ready before; back to Ready")])
        written = replace(adopted, manifest_mtime_ns=ev.mtime_ns or r.manifest_mtime_ns)
        node, more = _start_wait(node, opts, written, ev.now, adopted=True)
        return node, [*acts, Log("info", f"manifest already patched with config {ev.config_hash[:12]}; adopting "
                                         "it without a write"), *more]
    # pending
    if ev.manifest_change and opts.check_extenders and node.probed != ev.config_hash:
        # (also while the turn is held: a new config that comes while the last one waits for its restart)
        # Pre-flight: nothing is written and no turn is taken before the extenders answer.
        if node.probing == ev.config_hash:  # its answer comes as Probed, and now counts as the pre-flight
            return replace(node, periodic=False), acts
        node = replace(node, probing=ev.config_hash, periodic=False,
                       probe_failures=node.probe_failures if node.failed_probe == ev.config_hash else 0)
        return _pending_if_new(node, [*acts, Probe(ev.config_hash)])
    if ev.manifest_change and ev.kubelet_down:
        return _hold_for_kubelet(node, ev.kubelet_down, acts)
    if node.kubelet_held:
        node = replace(node, kubelet_held="")
        acts.append(Log("info", "the kubelet on this node is healthy again: the write goes on"))
    turn = ev.manifest_change and opts.coordinated and not was_ready
    if turn and node.wait is None:  # (a write waiting for its restart uses its turn: never given back here)
        node, said, held_back = _in_order(node, ev, opts)
        acts += said
        if held_back:
            return _pending_if_new(node, acts)
    if turn and node.turn != "held":
        return _pending_if_new(replace(node, turn="asked"), [*acts, TakeTurn(ev.source_hash)])
    if ev.manifest_change and node.phase != NodeState.PENDING:
        node, acts = _phase(node, NodeState.PENDING, after=acts)
    return node, [*acts, Apply()]


def _hold_for_kubelet(node: Node, why: str, acts: list[Action]) -> Step:
    """No write while the node's kubelet is known not healthy: no kubelet restarts the scheduler onto it, and the
    rollout turn would be held for a restart nobody makes (the turn, asked or held, is given back: another node
    may go). The state stays what it is (a new node says Pending); one line and one Warning per distinct reason;
    planned again every ``KUBELET_RETRY`` seconds. A write that waits for its restart keeps its wait and turn."""
    if why != node.kubelet_held:
        line = f"kubelet on this node not healthy ({why}): holding the write"
        acts = [*acts, Log("warning", line), Note("KubeletNotHealthy", line, warning=True)]
    node = replace(node, kubelet_held=why)
    node, acts = _release(node, after=acts) if node.wait is None else (node, acts)
    return _pending_if_new(node, [*acts, RetryLater(KUBELET_RETRY)])


#: A peer in one of these states is still on its way (or its agent has said nothing yet: a fresh install).
_MOVING = ("", NodeState.PENDING.value, NodeState.WAITING_FOR_RESTART.value)


def order_wait(s: Schedulers, source_hash: str) -> str:
    """Why this node's turn waits for the leader-aware order ("": it may go). Only when a leader is known and
    there are other control-plane nodes: before any restart another scheduler must be Ready to take the lead
    over; and the leader's node goes last, after every peer that still has to change (``_MOVING``, or Ready on
    another source: its kubelet has not refreshed the ConfigMap yet) and could (its scheduler Ready)."""
    if not (s.known and s.leader and s.peers):
        return ""
    if not any(p.ready for p in s.peers):
        return "no kube-scheduler on another control-plane node is Ready to take the lead over"
    first = [p.node for p in s.peers if p.ready and (
        p.state in _MOVING or (p.state == NodeState.READY.value and p.source_hash != source_hash))]
    return f"this node's kube-scheduler leads: {', '.join(first)} change first" if s.leads and first else ""


def _in_order(node: Node, ev: Planned, opts: Lifecycle) -> tuple[Node, list[Action], bool]:
    """The leader-aware order before the turn: (node, actions, held back). Held back: Pending, a turn asked or
    held given back, until the view changes (the adapter's re-plan) or ``opts.leader_wait`` after the first
    hold-back of this write; then it goes on whatever the order says (it never blocks the file work for good)."""
    why = order_wait(ev.schedulers, ev.source_hash)
    since, said = node.order if node.order is not None else (ev.now, "")
    if why and ev.now < since + opts.leader_wait:
        node, rel = _release(replace(node, order=(since, why)))
        told: list[Action] = [Log("info", f"rollout turn held back: {why}")] if why != said else []
        return node, [*told, *rel, RetryLater(since + opts.leader_wait - ev.now)], True
    if not said:
        return node, [], False
    told = [Log("warning", f"{said}; going on after {opts.leader_wait:g}s of leader-aware order") if why
            else Log("info", "the leader-aware order lets this node go")]
    return replace(node, order=(since, "")), told, False


def _pending_if_new(node: Node, acts: list[Action]) -> Step:
    """A node that has said nothing yet says Pending while its write waits (for the pre-flight or the turn)."""
    if node.phase is not None:
        return node, acts
    return _phase(node, NodeState.PENDING, after=acts)


def with_missing(node: Node, ev: Planned, opts: Lifecycle) -> Step:
    """``planned``, and on top of it a ``--config`` naming a missing file the plan does not write back."""
    said = (node.record.phase, node.record.message)
    cleared = not ev.missing and (node.missing is not None or _says_missing(node))
    node, acts = _missing_cleared(node) if cleared else (node, [])
    node, more = planned(node, ev, opts)
    acts += more
    if cleared and node.phase is None:  # the agent restarted while the file was missing: what it said is lost
        node, acts = _phase(node, NodeState.FAILED if ev.kind in ("known-bad", "refused") else NodeState.PENDING,
                            ev.message or None if ev.kind in ("known-bad", "refused") else None, after=acts)
    if ev.missing:
        node, more = config_missing(node, ev.missing, said=said[0])
        acts += more
    # One report of where the node ended up (the last), none when it says what it said before.
    changed = (node.record.phase, node.record.message) != said or node.phase == NodeState.READY
    last = max((i for i, a in enumerate(acts) if isinstance(a, Publish)), default=-1) if changed else -1
    return node, [a for i, a in enumerate(acts) if not isinstance(a, Publish) or i == last]


def config_missing(node: Node, message: str, *, said: str = "") -> Step:
    """Failed with ``message`` (the path); one Warning ``ConfigMissing`` per distinct message (``said``: the
    phase reported before; no change of phase: a ``Note`` carries it). A write waiting for its restart keeps
    its wait: a scheduler that cannot start is a crash loop, rolled back."""
    m = node.missing
    new = m is None or m.message != message
    acts: list[Action] = [Log("error", message)] if new else []
    note: list[Action] = [Note("ConfigMissing", message, warning=True)] if new else []
    if node.wait is not None:
        return replace(node, missing=Missing(message, "", None)), [*acts, *note]
    if m is not None and (node.record.phase, node.record.message) == (NodeState.FAILED.value, m.said):
        before = (m.phase, m.phase_message)  # the plan left the node as the missing file had it
    elif m is None and _says_missing(node):
        before = ("", None)  # said by an agent before a restart: what it said without the file is lost
    else:
        before = (node.record.phase, node.record.message)
    missing = Missing(message, *before)
    node = replace(node, missing=missing)
    if said == NodeState.FAILED.value:  # no change of phase: the annotations change, and the Note says why
        return _phase(node, NodeState.FAILED, missing.said, after=[*acts, *note])
    return _phase(node, NodeState.FAILED, missing.said, reason="ConfigMissing", after=acts)


def _says_missing(node: Node) -> bool:
    """Whether the node's phase and message are a missing file's report (``config_missing``'s)."""
    return node.phase == NodeState.FAILED and MISSING_FILE in (node.record.message or "")


def _missing_cleared(node: Node) -> Step:
    """The file is back (or the manifest names it no more): the node says again what it said without it."""
    m = node.missing
    node = replace(node, missing=None)
    acts: list[Action] = [Log("info", "kube-scheduler's --config names no missing file any more")]
    if not _says_missing(node):
        return node, acts  # another transition spoke since (a write waited for its restart meanwhile)
    if m is None or not m.phase:
        return replace(node, record=replace(node.record, phase="", message=None)), acts
    return _phase(node, NodeState(m.phase), m.phase_message, after=acts)


def turn_changed(node: Node, ev: TurnChanged, opts: Lifecycle) -> Step:
    """The Lease actor answered. Held: plan again and write. Refused: the source failed elsewhere."""
    if ev.held:
        return replace(node, turn="held"), [Replan()]
    if ev.refused_bad and ev.config_hash:
        node2 = replace(node, turn="none", record=node.record.with_bad(ev.config_hash))
        acts: list[Action] = [Log("warning", f"this source was rolled back on another node; not trying config "
                                             f"{ev.config_hash[:12]} here")]
        if ev.config_hash not in node.record.bad_hashes:  # once per config: say why this node keeps its config
            acts.append(Note("PatchSkipped", f"config {ev.config_hash[:12]} was rolled back on another node; this "
                                             "node keeps its current config", warning=True))
        return node2, acts
    return node, []


def wrote(node: Node, ev: Wrote, opts: Lifecycle) -> Step:
    if not ev.manifest_change:  # only config files were rewritten (same content hash): nothing restarts
        return replace(node, record=ev.record), [Count("wrote")]
    record = replace(ev.record, restarted_at_ns=None)
    node, acts = _start_wait(node, opts, record, ev.now, adopted=False)
    return node, [Count("wrote"), *acts]


def probed(node: Node, ev: Probed, opts: Lifecycle) -> Step:
    """The pre-flight answered. Blocked: stay Pending, nothing written, and probe again after a backoff.
    Passed: plan again, and this time write."""
    w = node.wait
    if w is not None and w.probing and w.config_hash == ev.config_hash:
        return _canary_probed(node, replace(w, probing=False), ev, opts)
    if ev.config_hash != node.probing:
        return node, []  # a probe of a config that is no longer the one to write
    short = ev.config_hash[:12]
    periodic = node.periodic
    node = replace(node, probing="", periodic=False)
    if periodic and w is None and node.phase == NodeState.READY and ev.config_hash == node.record.config_hash:
        return _periodic_probed(node, ev)
    if ev.blocking:
        failures = node.probe_failures + 1
        delay = _backoff(opts.probe_retry, opts.probe_retry_max, failures)
        message = f"{ev.blocking}; config {short} not written"
        acts: list[Action] = [Error("extender"),
                              Log("warning", f"{message}; probing again in {delay:g}s")]
        if message != node.record.message or node.phase != NodeState.PENDING:
            acts.append(Note("ExtenderUnreachable", message, warning=True))
        node, more = _phase(replace(node, probe_failures=failures, failed_probe=ev.config_hash, probed=""),
                            NodeState.PENDING, message)
        return node, [*acts, *more, RetryLater(delay)]
    acts = []
    if node.probe_failures:
        acts.append(Log("info", f"the extenders of config {short} answer now; patching"))
    warning = f"{ev.ignored}; ignorable, so config {short} is written anyway" if ev.ignored else ""
    if warning:
        acts += [Log("warning", warning), Note("ExtenderUnreachable", warning, warning=True)]
    node = replace(node, probed=ev.config_hash, probe_failures=0, failed_probe="",
                   record=replace(node.record, extender_warning=warning))
    if node.phase == NodeState.PENDING and node.record.message:  # the blocking sentence is no longer true
        node, acts = _phase(node, NodeState.PENDING, after=acts)
    return node, [*acts, Replan()]


def _canary_probed(node: Node, w: Wait, ev: Probed, opts: Lifecycle) -> Step:
    """The probe after the restart: a failure rolls back like a crash loop; an answer lets the node be Ready."""
    short = ev.config_hash[:12]
    if ev.blocking:
        return _fail_wait(node, w, opts, f"{ev.blocking} after kube-scheduler restarted with config {short}")
    acts: list[Action] = []
    if ev.ignored:
        warning = f"{ev.ignored} after kube-scheduler restarted with config {short}; ignorable, kept"
        acts += [Log("warning", warning), Note("ExtenderUnreachable", warning, warning=True)]
    return replace(node, wait=replace(w, extenders_checked=True)), acts


def probe_due(node: Node, ev: ProbeDue, opts: Lifecycle) -> Step:
    """While Ready (and nothing else under way), probe the running config's extenders."""
    r = node.record
    if not opts.check_extenders or node.phase != NodeState.READY or node.wait is not None or node.probing \
            or not r.config_hash:
        return node, []
    return replace(node, probing=r.config_hash, periodic=True), [Probe(r.config_hash)]


#: The start of the message a Ready node carries while the periodic probe finds an extender down; the cluster
#: verdict reads a Ready node with a message as not ready (``patcher.core.readiness``).
STOPPED_ANSWERING = "extenders stopped answering"


def _periodic_probed(node: Node, ev: Probed) -> Step:
    """A Ready node whose extender stopped answering stays Ready on disk (the manifest is not touched: the
    scheduler itself is fine) but says so in its message, which makes the cluster verdict NotReady."""
    message = f"{STOPPED_ANSWERING}: {ev.blocking}" if ev.blocking else None
    if message == node.record.message:
        return node, [Error("extender")] if message else []
    acts: list[Action] = []
    if message:
        acts += [Error("extender"), Log("warning", message),
                 Note("ExtenderUnreachable", message, warning=True)]
    else:
        acts.append(Log("info", "the extenders answer again"))
    return _phase(node, NodeState.READY, message, after=acts)


def write_failed(node: Node, ev: WriteFailed, opts: Lifecycle) -> Step:
    node, acts = _release(node)
    if ev.changed_underneath:
        return node, [*acts, Log("info", f"{ev.message}; planning again"), Replan()]
    acts += [Error("write"), Log("error", ev.message)]
    if node.wait is None:
        return _phase(node, NodeState.FAILED, f"{ev.message}; nothing was changed", after=acts)
    return node, acts


def observed(node: Node, ev: Observed, opts: Lifecycle) -> Step:
    w = node.wait
    if w is None:
        return node, []
    if ev.verdict == Verdict.READY and opts.check_extenders and not w.extenders_checked:
        # The restarted scheduler runs the config: prove its extenders answer once more before the node is
        # Ready and the turn passes to the next node (an extender can depend on what the restart changed).
        if w.probing:
            return node, []  # its answer comes as Probed
        return replace(node, wait=replace(w, probing=True)), [
            Log("info", f"kube-scheduler runs config {w.config_hash[:12]}; probing its extenders again before "
                        "the rollout moves on"), Probe(w.config_hash)]
    if ev.verdict == Verdict.READY:
        r = node.record
        good = LastGood(config_hash=r.config_hash, config_file=r.config_file, files=r.files,
                        source_hash=w.source_hash, original_sha256=r.original_sha256, api_version=r.api_version)
        seconds = max(0.0, (ev.wall_ns - w.written_ns) / 1e9)
        node = replace(node, wait=None, record=replace(r, last_good=good, restarted_at_ns=ev.wall_ns))
        # A restart nothing could observe has no duration: it must not skew the histogram.
        timed = [] if ev.reason == UNVERIFIED else [RestartSeen(seconds)]
        node, acts = _phase(node, NodeState.READY, after=[
            *timed, Prune(), Log("info", f"kube-scheduler runs config {w.config_hash[:12]}: {ev.reason}")])
        return _release(node, after=acts)
    if ev.verdict == Verdict.CRASH_LOOPING:
        return _fail_wait(node, w, opts, f"kube-scheduler crash-loops with config {w.config_hash[:12]} ({ev.reason})")
    if ev.now < w.deadline or (ev.settle_until is not None and ev.now < ev.settle_until):
        return node, []  # not yet, or only the settle time past it (bounded; the loop wakes at its end)
    return _timed_out(node, w, ev, opts)


def _timed_out(node: Node, w: Wait, ev: Observed, opts: Lifecycle) -> Step:
    """Past the restart deadline, the scheduler not back (and not waiting only for its settle time).

    A kubelet seen not healthy at or past the deadline gives no verdict: nothing restarts a static pod without
    it. The wait then goes on for one more ``restart_timeout`` (the kubelet may come back and restart the
    scheduler, judged as any restart: a crash loop still marks the config bad), and never longer: the rollout
    turn is held all that time, and every other node waits for it. At that bound the node rolls back as on any
    timeout (a kubelet that comes back must start the config that ran before, not one nobody judged, while other
    nodes may be restarting) but marks nothing bad: the turn goes back without the Lease's refusal, so the
    rollout goes on elsewhere, and this node tries the config again once its kubelet is healthy
    (``_hold_for_kubelet``)."""
    short = w.config_hash[:12]
    down = ev.kubelet_down or w.kubelet_down
    if not down and ev.blind and ev.now < w.deadline + opts.restart_timeout:
        # A broken watch alone never decides a rollback: "not restarted yet" from a stale view says nothing about
        # the scheduler. One more timeout, bounded, for the view to come back before the verdict.
        return node, []
    if not down:
        return _fail_wait(node, w, opts, f"kube-scheduler did not come back Ready with config {short} within "
                                         f"{opts.restart_timeout:.0f}s ({ev.reason})")
    if ev.now < w.deadline + opts.restart_timeout:
        if w.kubelet_down:
            return node, []  # said once
        message = (f"kubelet on this node not healthy ({down}): no restart of kube-scheduler onto config {short} "
                   f"within {opts.restart_timeout:.0f}s; waiting {opts.restart_timeout:.0f}s more, then rolling back "
                   "without marking the config bad")
        return _phase(replace(node, wait=replace(w, kubelet_down=down)), NodeState.WAITING_FOR_RESTART, message,
                      after=[Log("warning", message), Note("KubeletNotHealthy", message, warning=True)])
    return _fail_wait(node, w, opts, f"kube-scheduler did not come back with config {short} within "
                                     f"{2 * opts.restart_timeout:.0f}s while the kubelet on this node was not "
                                     f"healthy ({down}): no verdict on the config, not marked bad; tried again once "
                                     "the kubelet is healthy", judged=False)


def _fail_wait(node: Node, w: Wait, opts: Lifecycle, reason: str, *, judged: bool = True) -> Step:
    """Roll back (or Failed without rollback) and give the turn back. ``judged``: a scheduler ran the config
    (or had its chance to): it is marked bad here and, through the Lease, on every node; not judged: neither."""
    node = replace(node, wait=None, record=node.record.with_bad(w.config_hash) if judged else node.record)
    bad = w.source_hash if judged else ""
    acts: list[Action] = [Count("rolled_back")]
    if not opts.rollback_on_failure:
        node, acts = _phase(node, NodeState.FAILED, reason, after=[*acts, Log("error", f"{reason}; rollback disabled")])
        return _release(node, bad, after=acts)
    good = node.record.last_good
    if good is None or good.config_hash == w.config_hash:  # nothing else ran here: the original is the target
        return node, [*acts, RollBack(reason, bad, good)]
    return node, [*acts, CheckLastGood(reason, bad, good)]


def last_good_checked(node: Node, ev: LastGoodChecked, opts: Lifecycle) -> Step:
    """Back to the last Ready config when it still fits the manifest; else to the original. The last Ready
    config was rendered for the manifest it ran with (version, flags): after an upgrade it may be an apiVersion
    the new scheduler does not serve, and then only the original is safe."""
    c = ev.check
    if ev.fits:
        return node, [RollBack(c.reason, c.bad_source, c.last_good, target="last-good")]
    return node, [Log("warning", f"{ev.why}; rolling back to the original"),
                  RollBack(c.reason, c.bad_source, c.last_good, target="original")]


def pruned(node: Node, ev: Pruned, opts: Lifecycle) -> Step:
    return replace(node, record=ev.record), []


def rollback_done(node: Node, ev: RollbackDone, opts: Lifecycle) -> Step:
    if ev.record is None:
        node, acts = _phase(node, NodeState.FAILED, f"{ev.reason}; rollback failed: {ev.error}",
                            after=[Error("rollback"), Log("error", f"rollback failed: {ev.error}")])
    else:
        message = f"{ev.reason}; rolled back to {ev.target}"
        node, acts = _phase(node, NodeState.ROLLED_BACK, message, record=ev.record, after=[Log("error", message)])
    return _release(node, ev.bad_source, after=acts)


#: The Node's message while the state folder cannot take the record (after the folder's error).
STATE_FOLDER_WAIT = "nothing is written until the record can be saved again; retrying"


def state_folder_failed(node: Node, ev: StateFolderFailed, opts: Lifecycle) -> Step:
    """Failed; a turn not used for a write is passed on (this node cannot write), a write waiting for its
    restart keeps its wait (judged once the folder works). One Warning per distinct error."""
    f = node.fault
    failures = (f.failures if f else 0) + 1
    delay = _backoff(opts.state_retry, opts.state_retry_max, failures)
    message = f"{ev.message}; {STATE_FOLDER_WAIT}"
    acts: list[Action] = [Error("state"), Log("error", f"{ev.message}; trying again in {delay:g}s")]
    if f is None or f.message != ev.message:
        acts.append(Note("StateFolderFailed", message, warning=True))
    before = (f.phase, f.phase_message) if f else (node.record.phase, node.record.message)
    node = replace(node, fault=Fault(ev.message, failures, *before), probing="")
    node, rel = _release(node) if node.wait is None else (node, [])
    node, more = _phase(node, NodeState.FAILED, message)
    return node, [*acts, *rel, *more, RetryLater(delay, "state-folder")]


def state_folder_ok(node: Node, ev: StateFolderOk, opts: Lifecycle) -> Step:
    """The node says again what it said before the fault (or Pending) and plans again."""
    f = node.fault
    if f is None:
        return node, []
    node = replace(node, fault=None)
    phase = NodeState(f.phase) if f.phase else NodeState.PENDING
    node, acts = _phase(node, phase, f.phase_message if f.phase else None)
    return node, [Log("info", f"the state folder takes the record again after {f.failures} failed "
                              f"attempt{'s' if f.failures != 1 else ''}; the node is {phase.value}"), *acts, Replan()]


# -- the stop ------------------------------------------------------------------------------------------------


#: Shares of the grace period a stop on an answering API may spend waiting for its rollout turn (the others'
#: restores: the Nth of N agents stopping together waits N-1 scheduler restarts) and, holding it, for its own
#: restored scheduler.
TURN_SHARE = 0.6
RESTORED_SHARE = 0.85


def stop_budget(now: float, opts: Lifecycle) -> tuple[float, float, float, float, float]:
    """The stop's deadlines: (confirm wait in seconds, turn until, restored until, answers until, end).

    Every wait for an answer ends by ``answers until``, whatever the grace period. Waits on an API that answers
    take shares of the grace period before a reserve (a fifth, at most 5 s) for the report and the exit, slow
    on a loaded node: the turn ``TURN_SHARE``, the restored scheduler up to ``RESTORED_SHARE`` and never the
    last 2 s before it. The turn's share is the larger one because every agent of a deleted DaemonSet gets its
    SIGTERM at the same time and the restores go one after the other: the last one waits for all the others."""
    g = opts.grace_period
    end = now + g - min(5.0, 0.2 * g)
    return (min(LEASE_CONFIRM_WAIT, 0.4 * g), now + TURN_SHARE * g, min(now + RESTORED_SHARE * g, end - 2.0),
            min(end, now + STOP_ANSWERS), end)


#: A peer whose agent says one of these has nothing (more) to restore: done, held by an operator, or no agent.
_NOTHING_TO_RESTORE = ("", NodeState.RESTORED.value, NodeState.HELD.value)


def stop_order_wait(s: Schedulers) -> str:
    """Why a restore on exit of the node whose kube-scheduler leads waits for its peers ("": it may go): when
    every agent leaves, the others restore first, so that the leader restarts last and once (the lead then moves
    once, to a scheduler already on the restored manifest). Peers that still have a patch to restore: any state
    but Restored, Held or none. Only when a leader is known and it is this node; the executor applies it only
    while the API answers and until its turn's deadline."""
    if not (s.known and s.leads and s.peers):
        return ""
    first = [p.node for p in s.peers if p.state not in _NOTHING_TO_RESTORE]
    return f"this node's kube-scheduler leads: {', '.join(first)} restore first" if first else ""


def stop(node: Node, ev: Stop, opts: Lifecycle) -> Step:
    """Restore or keep, by ``opts.restore_on_exit`` and what the agent knows of its DaemonSet (the table in
    docs/operator-contract.md, "The stop: restore or keep"). A stop that keeps leaves the rollout turn held while
    a write waits for its restart (the successor resumes the wait under the same holder name, and no other node
    may start a restart meanwhile); any other turn, asked or held, is released. A stop that restores asks for the
    turn itself (see ``Restore``)."""
    confirm, turn_until, restored_until, answers_until, end = stop_budget(ev.now, opts)
    waiting = node.wait is not None
    held = node.hold is not None
    node = replace(node, stopping=True, stop_until=answers_until, grace_until=end, wait=None, probing="")
    successor = ev.daemonset.successor()
    mode = opts.restore_on_exit
    if held or mode == "never" or (mode == "auto" and successor is not None):  # a held node is never restored
        reason = ("the node is held (its hold annotation): the agent leaves it as it is" if held
                  else "--restore-on-exit=never" if mode == "never"
                  else f"{successor}: the patch is kept for the successor pod, which adopts it without a write")
        acts: list[Action] = [Log("info", f"stop ({ev.why}): keeping the patch: {reason}"), Note("PatchKept", reason)]
        if waiting and node.turn == "held":
            acts.append(Log("info", "the rollout turn stays held for the successor, which resumes the wait for "
                                    "the scheduler's restart"))
            node = replace(node, turn="none")  # not ours to release: the successor renews it
        else:
            node, acts = _release(node, after=acts)
        return node, [*acts, Finish(answers_until, build_until=end)]
    reason = "--restore-on-exit=always" if mode == "always" else ev.daemonset.gone()
    ds = ev.daemonset
    everyone_leaves = opts.coordinated and (ds.deleting or (ds.known and not ds.exists))
    first = max(confirm, min(LEASE_ANSWERED_WAIT, 0.4 * opts.grace_period)) if everyone_leaves else confirm
    later = max(first, min(LEASE_LATER_WAIT, 0.4 * opts.grace_period))
    return node, [Log("info", f"stop ({ev.why}): restore on exit: {reason}"),
                  Restore(first, turn_until, restored_until, leader_last=everyone_leaves, answered_wait=later)]


def restore_done(node: Node, ev: RestoreDone, opts: Lifecycle) -> Step:
    """Restored, or an error and exit 1. A restore that waited on an answering API past the answers deadline
    gives the report ``FINAL_REPORT`` more; one the API left unanswered, nothing more."""
    node = replace(node, turn="held" if ev.held else "none")
    if not ev.api_silent and ev.now >= node.stop_until:
        node = replace(node, stop_until=ev.now + FINAL_REPORT)
    if ev.ok:
        record = State(bad_hashes=node.record.bad_hashes)  # a config that failed stays failed
        node, said = _phase(node, NodeState.RESTORED, record=record, after=[Count("restored")])
    else:
        said = [Error("restore"), Log("error", f"restore on exit failed: {ev.message}")]
    node, acts = _release(node, after=said)
    return node, [*acts, Finish(node.stop_until, code=0 if ev.ok else 1, build_until=node.grace_until)]


# -- the operator's hold ------------------------------------------------------------------------------------


HELD_MESSAGE = "held by an operator: the agent leaves this node as it is until the hold annotation is removed"


def held_message(hold: str) -> str:
    return HELD_MESSAGE + (f" ({hold})" if hold else "")


def hold_changed(node: Node, ev: HoldChanged, opts: Lifecycle) -> Step:
    """Held: forget the wait (its rollback would write), give the turn back, let go of the writer lock.
    Released: take the lock back and re-read the record (a hand restore changed it): ``Reclaimed``."""
    if not node.hold_known:
        node = replace(node, hold_known=True)
        if ev.hold is None:
            return node, [Log("info", "the node is not held: the agent goes on"), Replan()]
    if ev.hold == node.hold:
        return node, []
    if ev.hold is not None:  # the writer lock is let go at the first value only
        node2, rel = _release(replace(node, hold=ev.hold, wait=None, probing=""))
        return node2, [Log("warning", held_message(ev.hold)), *rel, *([LetGo()] if node.hold is None else []),
                       Publish("NodeHeld")]
    return replace(node, hold=None), [Log("info", "the hold annotation was removed: the agent takes the node back"),
                                      Reclaim()]


def reclaimed(node: Node, ev: Reclaimed, opts: Lifecycle) -> Step:
    """Back from a hold: as a freshly started agent on the record as it is on disk now, then plan."""
    node = replace(node, record=ev.record, wait=None, turn="none", probing="", probed="")
    node, acts = resumed(node, Resumed(ev.now), opts)
    return node, [*acts, *([Publish("HoldReleased")] if node.phase is not None else []), Replan()]


def hold_unknown(node: Node, ev: HoldUnknown, opts: Lifecycle) -> Step:
    """The bounded wait for the hold ran out: the file work must not stall for an API that is down or slow."""
    if node.hold_known:
        return node, []
    return replace(node, hold_known=True), [
        Log("warning", f"could not learn the node's hold within {ev.waited:g}s (no answer from the API): going on "
                       "as not held"), Replan()]


#: What may happen while the hold is not known yet: nothing that writes or judges a restart (a verdict could
#: roll back); the start's resume (which only adopts a wait), the turn's answer and the pre-flight's answer
#: (both end in a plan, held back too), the state folder's edge, and the stop.
_BEFORE_HOLD_KNOWN = (Resumed, TurnChanged, Probed, StateFolderFailed, StateFolderOk, Stop, RestoreDone)


def _gate(node: Node, event: Event, opts: Lifecycle) -> Step | None:
    """What the stop, the hold and the state folder's fault let through (None: the event's own transition)."""
    if node.stopping and not isinstance(event, RestoreDone):
        return node, []  # after SIGTERM nothing but the restore (or the keep) happens
    if isinstance(event, (HoldChanged, HoldUnknown)):
        return None  # the hold's own news passes the hold's and the fault's edges
    if not node.hold_known and not isinstance(event, _BEFORE_HOLD_KNOWN):
        return node, []  # planned again once the hold is known (``hold_changed``/``hold_unknown``)
    if node.hold is not None and not isinstance(event, Stop):  # nothing is written or judged; a stop keeps
        if isinstance(event, TurnChanged) and event.held:
            return replace(node, turn="none"), [ReleaseTurn()]  # a turn that comes anyway is given back
        return node, []
    if node.fault is not None and not isinstance(event, (Stop, RestoreDone, StateFolderFailed, StateFolderOk,
                                                         Reclaimed)):
        return node, []  # nothing is planned, written or judged while the record cannot be saved
    return None


def step(node: Node, event: Event, opts: Lifecycle) -> Step:
    if (gated := _gate(node, event, opts)) is not None:
        return gated
    return _TRANSITIONS[type(event)](node, event, opts)


_TRANSITIONS: dict[type[Any], Callable[[Node, Any, Lifecycle], Step]] = {
    Resumed: resumed, Planned: with_missing, TurnChanged: turn_changed, Pruned: pruned, Wrote: wrote,
    WriteFailed: write_failed, Observed: observed, LastGoodChecked: last_good_checked, RollbackDone: rollback_done,
    Probed: probed, ProbeDue: probe_due, StateFolderFailed: state_folder_failed,
    StateFolderOk: state_folder_ok, Stop: stop, RestoreDone: restore_done, Reclaimed: reclaimed,
    HoldChanged: hold_changed, HoldUnknown: hold_unknown}


UNVERIFIED = "restart not verified (no API and no local process check)"


def combine(verdicts: list[tuple[Verdict, str]]) -> tuple[Verdict, str]:
    """A crash loop seen by either check wins; otherwise either check proving the restart is enough. With no
    check at all (no API, no local check) the write is taken as live: nothing could ever prove it."""
    if not verdicts:
        return Verdict.READY, UNVERIFIED
    order = (Verdict.CRASH_LOOPING, Verdict.READY, Verdict.WAITING)
    return min(verdicts, key=lambda v: order.index(v[0]))
