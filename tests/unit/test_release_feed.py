"""``core.gates.ReleaseFeed``: the order a gated backlog goes out in, where the verdict is checked, and the stop.

The gatekeeper's workers call ``take`` under one lock; here a run of workers is played step by step (which
worker acts next is drawn), so the bound the docs promise is checked on every interleaving hypothesis finds:
once the check said no, what is still released is what was in flight, at most one pod per worker.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patcher.core.gates import GatedPod, ReleaseFeed


def pod(i: int, created: str, namespace: str = "default") -> GatedPod:
    return GatedPod(namespace, f"p{i}", f"uid-{i}", created, ("gate",), True)


#: Creation times repeat (same second), so namespace and name break the ties.
pods_st = st.lists(st.builds(pod, st.integers(0, 10_000), st.sampled_from(["2026-01-01T00:00:00Z",
                                                                           "2026-01-01T00:00:01Z",
                                                                           "2025-12-31T23:59:59Z"]),
                             st.sampled_from(["a", "b"])),
                   max_size=40, unique_by=lambda p: (p.namespace, p.name))


def oldest_first(pods: list[GatedPod]) -> list[GatedPod]:
    return sorted(pods, key=lambda p: (p.created, p.namespace, p.name))


@given(pods_st, st.integers(1, 10))
def test_every_pod_goes_once_oldest_first_and_each_batch_but_the_first_is_checked_first(
        pods: list[GatedPod], batch: int) -> None:
    feed = ReleaseFeed(pods, batch)
    asked: list[tuple[int, bool]] = []  # (pods handed out before, boundary)

    def may_send(boundary: bool) -> bool:
        asked.append((feed.taken, boundary))
        return True

    out = []
    while (p := feed.take(may_send)) is not None:
        out.append(p)
    assert out == oldest_first(pods)
    # Asked before each pod (not after the last); a boundary at each batch's first pod but the first batch's.
    assert asked == [(i, i > 0 and i % batch == 0) for i in range(len(pods))]
    assert feed.batches == -(-len(pods) // batch) and feed.left == 0 and not feed.stopped


def test_the_boundary_flag_marks_the_first_pod_of_each_later_batch() -> None:
    feed = ReleaseFeed([pod(i, f"2026-01-01T00:00:{i:02d}Z") for i in range(7)], 3)
    seen: list[bool] = []

    def may_send(boundary: bool) -> bool:
        seen.append(boundary)
        return True

    while feed.take(may_send):
        pass
    assert seen == [False, False, False, True, False, False, True]
    assert feed.batches == 3


@given(pods_st, st.integers(1, 10), st.integers(0, 45))
def test_a_no_ends_the_drain_for_good(pods: list[GatedPod], batch: int, stop_at: int) -> None:
    feed = ReleaseFeed(pods, batch)
    asked = []

    def may_send(boundary: bool) -> bool:
        asked.append(boundary)
        return len(asked) <= stop_at

    out = []
    while (p := feed.take(may_send)) is not None:
        out.append(p)
    assert out == oldest_first(pods)[:stop_at]
    assert feed.take(lambda _: True) is None and feed.take(may_send) is None  # and nothing is asked any more
    assert len(asked) == min(stop_at + 1, len(pods))
    assert feed.stopped == (stop_at < len(pods)) and feed.left == len(pods) - len(out)


@given(pods_st, st.integers(1, 6), st.integers(1, 8), st.lists(st.integers(0, 7), max_size=200),
       st.integers(0, 200))
def test_after_the_verdict_turns_only_the_pods_in_flight_are_released(
        pods: list[GatedPod], workers: int, batch: int, turns: list[int], turn_at: int) -> None:
    """Workers take a pod, send it, take the next (no barrier); the verdict turns NotReady (the check says no)
    at step ``turn_at``. Released afterwards: only pods taken before it, at most one a worker; what was
    released is always a prefix of the oldest-first order, give or take the pods in flight."""
    feed = ReleaseFeed(pods, batch)
    order = oldest_first(pods)
    in_flight: dict[int, GatedPod] = {}
    released: list[GatedPod] = []
    at_turn: list[GatedPod] | None = None  # in flight when the verdict turned
    after: list[GatedPod] = []
    for step, w in enumerate([t % workers for t in turns] + list(range(workers))):
        if at_turn is None and step >= turn_at:
            at_turn = list(in_flight.values())
        if w in in_flight:  # its release is answered; the worker takes its next pod at its next turn
            released.append(in_flight.pop(w))
            if at_turn is not None:
                after.append(released[-1])
            continue
        ready = at_turn is None
        taken = feed.take(lambda _boundary: ready)  # noqa: B023 (called right here, in this iteration)
        if taken is not None:
            in_flight[w] = taken
        # Everything handed out is released or in flight, and it is exactly the oldest pods, in any case.
        assert sorted(order.index(p) for p in [*released, *in_flight.values()]) == list(range(feed.taken))
    if at_turn is not None:
        assert set(after) <= set(at_turn) and len(at_turn) <= workers


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch size"):
        ReleaseFeed([], 0)
