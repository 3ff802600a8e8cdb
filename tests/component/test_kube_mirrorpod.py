"""MirrorPodWatcher against the emulator: field-selected list+watch, resume, 410, outages, deletion, stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube import transport
from patcher.adapters.kube.backoff import DENIED_QUICK_RETRIES, Backoff
from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.listwatch import (
    ListWatcher,
    _Undecodable,
    decode_event,
    split_records,
)
from patcher.adapters.kube.mirrorpod import MirrorPodWatcher
from patcher.adapters.kube.transport import Api
from patcher.core.kubeobj import mirror_pod_name
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod, tls_available, wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt
from tests.harness.helpers import NODE

NAME = mirror_pod_name("kube-scheduler", NODE)
PODS = "/api/v1/namespaces/kube-system/pods"


@pytest.fixture(params=["http", "https"])
def emu(request: pytest.FixtureRequest) -> Iterator[KubeEmulator]:
    if request.param == "https" and not tls_available():
        pytest.skip("the openssl tool is needed to make certificates")
    with KubeEmulator(tls=request.param == "https") as e:
        yield e


@pytest.fixture
def watcher(api: Api) -> Iterator[MirrorPodWatcher]:
    w = MirrorPodWatcher(api, "kube-system", NAME, backoff=Backoff(0.05, 0.2), watch_timeout_s=30)
    yield w
    w.stop()


def annotation(w: MirrorPodWatcher, key: str = "x") -> Any:
    return ((w.latest() or {}).get("metadata", {}).get("annotations") or {}).get(key)


def bump(emu: KubeEmulator, value: str, name: str = NAME) -> None:
    emu.mutate("pods", name, lambda p: p["metadata"]["annotations"].update(x=value), namespace="kube-system")


def watches(emu: KubeEmulator) -> list[dict[str, str]]:
    return [r.query for r in emu.requests("GET", PODS) if r.query.get("watch") == "true"]


def lists(emu: KubeEmulator) -> list[dict[str, str]]:
    return [r.query for r in emu.requests("GET", PODS) if "watch" not in r.query]


def test_sees_creation_and_updates_of_that_one_pod_only(emu: KubeEmulator, api: Api) -> None:
    emu.set_pod(make_mirror_pod(node_name="cp-2", started_at="2026-11-21T23:40:02Z"))  # another node's
    seen: list[Any] = []
    watcher = MirrorPodWatcher(api, "kube-system", NAME, on_update=seen.append, backoff=Backoff(0.05, 0.2))
    watcher.start()
    assert watcher.wait_synced(5)
    assert watcher.latest() is None
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    assert wait_until(lambda: watcher.latest() is not None, 5)
    bump(emu, "1")
    assert wait_until(lambda: annotation(watcher) == "1", 5)
    bump(emu, "1", name="kube-scheduler-cp-2")
    bump(emu, "2")  # after the other pod's change in the stream: seen once the other pod's would have been
    assert wait_until(lambda: annotation(watcher) == "2", 5)
    # The first list reports the pod absent; then its creation and two updates. Nothing of the other pod.
    assert [p and p["metadata"]["name"] for p in seen] == [None, NAME, NAME, NAME]
    # Every read is field-selected on the pod's name: nothing ever lists the namespace.
    reads = emu.requests("GET", PODS)
    assert reads and all(r.query["fieldSelector"] == f"metadata.name={NAME}" for r in reads)
    assert emu.requests("GET", f"{PODS}/{NAME}") == []
    assert len(lists(emu)) == 1
    assert watches(emu)[0]["resourceVersion"] and watches(emu)[0]["allowWatchBookmarks"] == "true"
    watcher.stop()


def test_resumes_after_a_dropped_stream_without_listing_again(
    emu: KubeEmulator, watcher: MirrorPodWatcher
) -> None:
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    watcher.start()
    assert wait_until(lambda: watcher.latest() is not None and emu.open_watches == 1, 5)
    bump(emu, "1")
    assert wait_until(lambda: annotation(watcher) == "1", 5)
    last_rv = (watcher.latest() or {})["metadata"]["resourceVersion"]
    emu.drop_watches()
    assert wait_until(lambda: len(watches(emu)) == 2 and emu.open_watches == 1, 5)
    bump(emu, "2")
    assert wait_until(lambda: annotation(watcher) == "2", 5)
    assert watches(emu)[1]["resourceVersion"] == last_rv  # resumed after the last event delivered
    assert len(lists(emu)) == 1


def test_lists_again_after_410_gone(emu: KubeEmulator, watcher: MirrorPodWatcher) -> None:
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    watcher.start()
    assert wait_until(lambda: watcher.latest() is not None and emu.open_watches == 1, 5)
    with emu.outage("refuse"):
        bump(emu, "while-away")
        emu.compact()  # the version the watcher holds is now older than the server remembers
    assert wait_until(lambda: annotation(watcher) == "while-away", 5)
    assert len(lists(emu)) == 2  # the resume got 410 Gone, so it listed again
    assert wait_until(lambda: emu.open_watches == 1, 5)
    bump(emu, "watching-again")
    assert wait_until(lambda: annotation(watcher) == "watching-again", 5)
    assert len(lists(emu)) == 2


def test_survives_an_outage_and_catches_up(emu: KubeEmulator, watcher: MirrorPodWatcher) -> None:
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    watcher.start()
    assert wait_until(lambda: emu.open_watches == 1, 5)
    with emu.outage("refuse"):
        bump(emu, "during-outage")
        assert wait_until(lambda: emu.open_watches == 0, 5)  # the outage closed the watch: only a new one sees it
    assert wait_until(lambda: annotation(watcher) == "during-outage", 5)
    answered = emu.count("GET", 503)
    with emu.outage("503"):
        bump(emu, "during-503")
        assert wait_until(lambda: emu.count("GET", 503) >= answered + 2, 5)  # it tried again, and again, meanwhile
    assert wait_until(lambda: annotation(watcher) == "during-503", 5)


def test_deletion_and_recreation_by_the_kubelet(emu: KubeEmulator, api: Api) -> None:
    """The kubelet deletes the old mirror pod (no grace period) and creates the new one: the API server first
    sends the old pod marked with a deletionTimestamp, then its deletion (tests/fixtures/kubelet/)."""
    seen: list[tuple[str, bool] | None] = []

    def record(pod: dict[str, Any] | None) -> None:
        seen.append((pod["metadata"]["uid"], bool(pod["metadata"].get("deletionTimestamp"))) if pod else None)

    w = MirrorPodWatcher(api, "kube-system", NAME, backoff=Backoff(0.05, 0.2), on_update=record)
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    with w:
        assert wait_until(lambda: w.latest() is not None and emu.open_watches == 1, 5)
        first_uid = (w.latest() or {})["metadata"]["uid"]
        emu.delete("pods", NAME, namespace="kube-system")
        assert wait_until(lambda: len(seen) == 3 and w.latest() is None, 5)
        emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:41:00Z"))
        assert wait_until(lambda: w.latest() is not None, 5)
    assert seen[:3] == [(first_uid, False), (first_uid, True), None]
    assert seen[3] is not None and seen[3][0] != first_uid and not seen[3][1]


def test_stop_is_prompt_with_a_stream_open(emu: KubeEmulator, watcher: MirrorPodWatcher) -> None:
    watcher.start()
    assert wait_until(lambda: emu.open_watches == 1, 5)
    watcher.stop(timeout=30)
    # The stream's read timeout is 240 s: a stop that waited for it would still be running here. How fast the
    # stop is belongs to the bench; a fixed bound would fail on a loaded 2-core CI machine.
    assert wait_until(lambda: not any(t.name == f"mirror-pod-{NAME}" for t in threading.enumerate()), 30)


def test_server_side_timeout_resumes_without_listing_again(tmp_path: Path) -> None:
    with KubeEmulator() as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
        with MirrorPodWatcher(api, "kube-system", NAME, backoff=Backoff(0.05, 0.2), watch_timeout_s=1) as w:
            assert wait_until(lambda: len(watches(emu)) >= 2 and emu.open_watches == 1, 5)
            bump(emu, "after-timeout")
            assert wait_until(lambda: annotation(w) == "after-timeout", 5)
        assert watches(emu)[0]["timeoutSeconds"] == "1"
        assert len(lists(emu)) == 1  # a clean end of the stream is resumed from its resourceVersion
        api.close()


# -- misbehaving watches ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"<html>502 Bad Gateway</html>", b"[1, 2]", b'"ADDED"', b'{"type": "ADDED"}',
                                  b'{"type": 1, "object": {}}', b'{"type": "ADDED", "object": []}', b"\xff\xfe{",
                                  b'{"type": "ADDED", "object": {"a": 1}'])
def test_undecodable_lines_are_refused(line: bytes) -> None:
    with pytest.raises(_Undecodable):
        decode_event(line)


def test_decoding_events_and_splitting_chunks() -> None:
    assert decode_event(b"  \r") is None
    assert decode_event(b'{"type": "BOOKMARK", "object": {"metadata": {}}}') == ("BOOKMARK", {"metadata": {}})
    chunks = [b'{"a"', b': 1}\n{"b": 2}\n\n{"c"', b": 3}"]
    assert list(split_records(chunks)) == [b'{"a": 1}', b'{"b": 2}', b"", b'{"c": 3}']


def test_a_stream_that_closes_after_one_event_backs_off(tmp_path: Path) -> None:
    with KubeEmulator(bookmark_interval=0.01) as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
        emu.watch_close_after = 1  # each watch: one bookmark, then a clean end
        backoff = Backoff(0.01, 0.05, jitter=0.0)
        # Any stream counts as short here (min_healthy_s), so a slow machine cannot make one look healthy.
        with MirrorPodWatcher(api, "kube-system", NAME, backoff=backoff, min_healthy_s=60) as w:
            assert wait_until(lambda: len(watches(emu)) >= 5, 10)
            assert backoff.failures >= 4  # a delivered event did not reset the backoff
            assert len(lists(emu)) == 1  # a clean end is resumed from its resourceVersion, not listed again
            assert w.latest() is not None
        api.close()


def test_undecodable_watch_data_lists_again_logs_once_and_marks_the_view_stale(
    emu: KubeEmulator, watcher: MirrorPodWatcher, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.listwatch")
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    watcher.start()
    assert wait_until(lambda: watcher.fresh and emu.open_watches == 1, 5)
    emu.watch_garbage = b"<html>502 Bad Gateway</html>"
    emu.drop_watches()
    assert wait_until(lambda: len(lists(emu)) >= 4, 10)
    # Each relist opens a watch that is fresh until its garbage arrives: the view is stale between them.
    assert wait_until(lambda: not watcher.fresh, 10)
    assert watcher.latest() is not None  # the last view is kept; it is only not trusted to be current
    bump(emu, "during-garbage")  # every relist still brings the pod up to date: the restart proof goes on
    assert wait_until(lambda: annotation(watcher) == "during-garbage", 10)
    kinds = ["watch" if r.query.get("watch") == "true" else "list" for r in emu.requests("GET", PODS)]
    garbage_from = [i for i, k in enumerate(kinds) if k == "watch"][1]  # the resume after the drop
    for i in range(garbage_from, len(kinds) - 1):
        if kinds[i] == "watch":
            assert kinds[i + 1] == "list", kinds  # never the same watch again: list first
    warnings = [r for r in caplog.records if "undecodable" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]
    emu.watch_garbage = None
    bump(emu, "after-garbage")
    assert wait_until(lambda: annotation(watcher) == "after-garbage" and watcher.fresh, 10)


# --- API failures by class (kube/errors.py), seen through the shared ListWatcher -------------------------


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "patcher.adapters.kube.listwatch" and "failed (" in r.getMessage()]


@pytest.mark.parametrize("code", [403, 401, 503, 500])
def test_a_refused_list_is_retried_at_the_first_short_delay(tmp_path: Path, code: int,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """One refusal, a 403 included: a restarting kube-apiserver denies requests that arrive before its RBAC
    caches synced (tests/real/test_real_nodes.py), so a denial gets the ordinary short retry and heals."""
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.listwatch")
    with KubeEmulatorExt() as emu:
        emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
        emu.fail("GET", PODS, code)
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        synced: list[list[Any]] = []
        w = ListWatcher(api, transport.PODS, "kube-system", on_sync=synced.append,
                        on_event=lambda kind, obj: None, name="pods", failure_level=logging.WARNING,
                        backoff=Backoff(initial=0.01, maximum=600.0, jitter=0.0))
        w.start()
        try:
            assert wait_until(lambda: bool(failures(caplog)), 5)
            [line] = failures(caplog)
            assert line.levelno == logging.WARNING
            assert line.getMessage().startswith(f"pods failed (HTTP {code} ")
            assert line.getMessage().endswith("retrying in 0.01s")
            assert wait_until(lambda: w.fresh, 5)
            assert [[p["metadata"]["name"] for p in items] for items in synced] == [[NAME]]
        finally:
            w.stop()
            api.close()


@pytest.mark.parametrize("code", [403, 401])
def test_a_denial_that_persists_waits_the_longest_delay(tmp_path: Path, code: int,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Past DENIED_QUICK_RETRIES denials in a row it is the Role or the token: no hot retries."""
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.listwatch")
    with KubeEmulatorExt() as emu:
        emu.fail("GET", PODS, code, times=100)
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        w = ListWatcher(api, transport.PODS, "kube-system", on_sync=lambda items: None,
                        on_event=lambda kind, obj: None, name="pods", failure_level=logging.DEBUG,
                        backoff=Backoff(initial=0.01, maximum=600.0, jitter=0.0))
        w.start()
        try:
            assert wait_until(lambda: len(failures(caplog)) == DENIED_QUICK_RETRIES + 1, 5)
            delays = [r.getMessage().rsplit(" ", 1)[1] for r in failures(caplog)]
            assert delays == ["0.01s", "0.02s", "0.04s", "600.00s"]
            assert not w.fresh and len(lists(emu)) == DENIED_QUICK_RETRIES + 1
        finally:
            w.stop()
            api.close()


def test_a_bug_in_a_callback_is_logged_with_its_traceback_not_taken_for_an_api_failure(
        emu: KubeEmulator, api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="patcher.adapters.kube.listwatch")
    emu.set_pod(make_mirror_pod(node_name=NODE, started_at="2026-11-21T23:40:02Z"))
    calls: list[int] = []

    def on_sync(items: list[Any]) -> None:
        calls.append(len(items))
        if len(calls) == 1:
            raise KeyError("a consumer's bug")

    w = ListWatcher(api, transport.PODS, "kube-system", on_sync=on_sync,
                    on_event=lambda kind, obj: None, name="pods", backoff=Backoff(0.01, 0.05))
    w.start()
    try:
        assert wait_until(lambda: len(calls) >= 2 and w.fresh, 5)  # retried with backoff, then it works
    finally:
        w.stop()
    [bug] = [r for r in caplog.records if r.exc_info and r.name == "patcher.adapters.kube.listwatch"]
    assert bug.getMessage() == "pods: unexpected error" and bug.levelno == logging.ERROR
    assert failures(caplog) == []
