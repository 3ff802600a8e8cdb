"""plan against the real kube-scheduler: every recorded verdict of the binary, on every machine.

`make config-oracle` runs every case of ``tools/schedconfig_cases.py`` on the kube-scheduler of each built minor
and records what it did in ``tests/fixtures/schedconfig_oracle/1.N.json`` (keyed by the case's content hash;
the cases themselves in ``cases.json``). Here, with no binary needed, ``plan``'s verdict on each case must be the
binary's: refused exactly when the scheduler exited. The few cases where plan is stricter on purpose (see
docs/scheduler-config.md "Stricter than upstream") are listed by hash and reason in ``known.json``; such an entry
that no longer disagrees fails too, so the list cannot rot. The ``real_cluster`` test re-runs a fixed sample on
the binaries and fails on any change from the recorded data.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tools.schedconfig_oracle import (
    DATA,
    Case,
    plan_verdict,
    read_cases,
    read_results,
    recorded_minors,
    run_minor,
)

MINORS = recorded_minors()
KNOWN: dict[str, str] = json.loads((DATA / "known.json").read_text())  # case hash -> why plan differs
SAMPLE_SIZE = 32


#: The tests that read every minor's disagreements run on one worker, which works them out once per minor.
ORACLE_GROUP = pytest.mark.xdist_group("schedconfig-oracle")


@functools.cache
def _disagreements(minor: int) -> dict[str, str]:
    """"1.N/<hash>" -> what each side said, for every recorded case where plan and the binary differ."""
    cases, data = read_cases(), read_results(minor)
    found = {}
    with tempfile.TemporaryDirectory() as scratch:
        for key, verdict in data["verdicts"].items():
            problem = plan_verdict(cases[key], data["version"], Path(scratch))
            if (problem is None) != (verdict["outcome"] == "started"):
                found[f"1.{minor}/{key}"] = (f"{cases[key].origin}: binary {verdict['outcome']} "
                                             f"{verdict['message']!r}; plan {problem or 'accepted'!r}")
    return found


def test_the_data_covers_every_built_minor_and_enough_cases() -> None:
    assert MINORS, "no recorded verdicts: run `make config-oracle`"
    cases = read_cases()
    assert len(cases) >= 500, len(cases)
    for minor in MINORS:
        assert set(read_results(minor)["verdicts"]) == set(cases), f"1.{minor}: run `make config-oracle`"


def test_the_recorded_cases_are_the_generated_ones() -> None:
    """The generator is deterministic and the data was made from it: a case added or changed without a run of
    `make config-oracle` fails here rather than going unjudged."""
    from tools.schedconfig_cases import generate

    assert [case.key for case in generate()] == [case.key for case in generate()]
    assert {case.key for case in generate()} == set(read_cases())


@ORACLE_GROUP
@pytest.mark.parametrize("minor", MINORS, ids=[f"1.{m}" for m in MINORS])
def test_plan_agrees_with_the_binary(minor: int) -> None:
    found = _disagreements(minor)
    unexpected = {key: what for key, what in found.items() if key.split("/")[1] not in KNOWN}
    assert not unexpected, f"{len(unexpected)} verdicts differ from kube-scheduler 1.{minor}:\n" + "\n".join(
        f"{key} {what}" for key, what in sorted(unexpected.items()))
    for key, what in sorted(found.items()):  # the known ones, shown (pytest -s), never skipped silently
        print(f"known disagreement {key} {what}: {KNOWN[key.split('/')[1]]}")


@ORACLE_GROUP
def test_the_known_disagreements_still_disagree_and_say_why() -> None:
    """A known disagreement is plan refusing on purpose what the binary starts with (docs/scheduler-config.md
    "Stricter than upstream"): each says why, and each still disagrees on some minor, so the list cannot rot."""
    found = {key.split("/")[1] for minor in MINORS for key in _disagreements(minor)}
    for key, why in sorted(KNOWN.items()):
        assert why.strip().startswith("stricter on purpose"), key
    assert not set(KNOWN) - found, f"in known.json but plan agrees now (remove them): {sorted(set(KNOWN) - found)}"
    assert len(KNOWN) <= 25, "known disagreements are exceptions, not a way to park failures"


def sample(cases: dict[str, Case]) -> list[Case]:
    """A fixed sample: every n-th case in hash order, so it spreads over origins and stays the same run to run."""
    keys = sorted(cases)
    step = max(1, len(keys) // SAMPLE_SIZE)
    return [cases[key] for key in keys[::step][:SAMPLE_SIZE]]


@pytest.mark.real_cluster
@pytest.mark.timeout(300)
def test_the_binaries_still_give_the_recorded_verdicts() -> None:
    """The sample on every built minor at once (one API server each): any verdict that changed fails."""
    from tests.harness.real.controlplane import built_releases, missing_reason

    if (why := missing_reason()) is not None:
        pytest.skip(why)
    releases = [b for b in built_releases() if b.minor in MINORS]
    chosen = sample(read_cases())
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(releases)) as pool:
        results = dict(zip([b.minor for b in releases],
                           pool.map(lambda b: run_minor(b, chosen, workers=2), releases), strict=True))
    took = time.monotonic() - began
    changed: list[str] = []
    for minor, verdicts in results.items():
        recorded: dict[str, Any] = read_results(minor)["verdicts"]
        for case in chosen:
            now, then = verdicts[case.key], recorded[case.key]
            if now.outcome != then["outcome"]:
                changed.append(f"1.{minor}/{case.key} {case.origin}: recorded {then['outcome']} "
                               f"{then['message']!r}, now {now.outcome} {now.message!r}")
    print(f"{len(chosen)} cases x {len(releases)} minors in {took:.1f} s")
    assert not changed, "\n".join(changed)


# -- the oracle's own pure parts: what it changes in a case, and the line it keeps --------------------------------


def test_the_oracle_gives_a_config_without_kubeconfig_its_own_and_changes_nothing_else() -> None:
    from tools.schedconfig_oracle import inject_kubeconfig

    head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
    assert inject_kubeconfig(head, "/k") == head + "clientConnection:\n  kubeconfig: /k\n"
    nested = head + "clientConnection:\n    qps: 5\nparallelism: 8\n"
    expected = head + "clientConnection:\n    kubeconfig: /k\n    qps: 5\nparallelism: 8\n"
    assert inject_kubeconfig(nested, "/k") == expected
    assert inject_kubeconfig(head + "clientConnection: {}\n", "/k") == head + "clientConnection: {kubeconfig: /k}\n"
    own = head + "clientConnection:\n  kubeconfig: relative.conf\n"
    assert inject_kubeconfig(own, "/k") == own  # the case's own value is what the scheduler must read
    assert json.loads(inject_kubeconfig('{"kind": "KubeSchedulerConfiguration"}', "/k"))["clientConnection"] == {
        "kubeconfig": "/k"}


def test_the_oracle_maps_node_files_but_not_missing_ones() -> None:
    from tools.schedconfig_oracle import map_node_files

    files = {"kubeconfig": "/tmp/k", "caFile": "/tmp/ca", "certFile": "/tmp/c", "keyFile": "/tmp/key"}
    text = "  tlsConfig:\n    certFile: /etc/kubernetes/pki/x.crt\n    keyFile: '/etc/x.key'\n"
    assert map_node_files(text, files) == "  tlsConfig:\n    certFile: /tmp/c\n    keyFile: '/tmp/key'\n"
    assert map_node_files("kubeconfig: /nonexistent/k\n", files) == "kubeconfig: /nonexistent/k\n"


def test_the_oracle_keeps_the_line_that_says_why() -> None:
    from tools.schedconfig_oracle import error_line

    log = ('I1128 06:41:00.1 1 serving.go:386] Generated self-signed cert\n'
           'E1128 06:41:00.2 1 run.go:72] "command failed" err="unknown flag"\n')
    assert error_line(log) == '"command failed" err="unknown flag"'
    assert error_line("Flag --x has been deprecated\nError: unknown flag: --port\nUsage:\n") == (
        "Error: unknown flag: --port")
    assert error_line("panic: runtime error: invalid memory address\n\ngoroutine 1\n").startswith("panic: runtime")


def test_cases_have_stable_content_hashes() -> None:
    a = Case("apiVersion: v\n", ("--a",), origin="one")
    assert a.key == Case("apiVersion: v\n", ("--a",), origin="other").key  # the origin is not the identity
    assert a.key != Case("apiVersion: v\n", ("--b",)).key
