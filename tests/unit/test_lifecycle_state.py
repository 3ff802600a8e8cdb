"""The state record: typed, frozen, versioned; today's (version 1) files still read."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patcher.core.errors import PatcherError
from patcher.core.state import FORMAT_VERSION, LastGood, State, decode, encode
from patcher.services.record import StateStore

V1 = {  # a state.json as the agent wrote it before the typed record
    "manifest": "/etc/kubernetes/manifests/kube-scheduler.yaml", "config_hash": "a" * 64,
    "config_file": "config-aaaaaaaaaaaa.yaml", "files": ["config-aaaaaaaaaaaa.yaml"], "previous_files": [],
    "written": ["config-aaaaaaaaaaaa.yaml"], "original_sha256": "b" * 64, "patched_sha256": "c" * 64,
    "manifest_mtime_ns": 1_700_000_000_000_000_000, "phase": "Ready", "bad_hashes": ["d" * 64],
    "last_good": {"config_hash": "a" * 64, "config_file": "config-aaaaaaaaaaaa.yaml",
                  "files": ["config-aaaaaaaaaaaa.yaml"], "source_hash": "e" * 64, "original_sha256": "b" * 64},
    "extra": {"source_hash": "e" * 64, "message": None, "restarted_at_ns": 1_700_000_001_000_000_000},
}


def test_a_version_1_record_reads_into_the_typed_one(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps(V1))
    state = StateStore(tmp_path, "/var/lib/scheduler-patcher").load()
    assert state.phase == "Ready" and state.source_hash == "e" * 64
    assert state.restarted_at_ns == 1_700_000_001_000_000_000
    assert state.files == ("config-aaaaaaaaaaaa.yaml",) and state.bad_hashes == ("d" * 64,)
    assert state.last_good == LastGood("a" * 64, "config-aaaaaaaaaaaa.yaml", ("config-aaaaaaaaaaaa.yaml",),
                                       "e" * 64, "b" * 64)


def test_a_saved_record_is_version_2_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "/var/lib/scheduler-patcher")
    state = State.from_json(V1)
    store.save(state)
    raw = json.loads((tmp_path / "state.json").read_text())
    assert raw["version"] == FORMAT_VERSION and "extra" not in raw
    assert store.load() == state


def test_the_record_is_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        State().phase = "Ready"  # type: ignore[misc]
    assert State().with_bad("x").with_bad("x").bad_hashes == ("x",)


@pytest.mark.parametrize("text", ["[]", '{"files": 3}', "{not json"])
def test_a_broken_record_is_one_line_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "state.json").write_text(text)
    with pytest.raises(PatcherError, match=r"state\.json"):
        StateStore(tmp_path, "/var/lib/scheduler-patcher").load()


@given(st.builds(State, phase=st.sampled_from(["", "Pending", "Ready", "Failed"]), message=st.none() | st.text(),
                 files=st.lists(st.text(), max_size=3).map(tuple), restarted_at_ns=st.none() | st.integers(0, 2**63),
                 last_good=st.none() | st.builds(LastGood, st.text(min_size=1), st.text(),
                                                 st.lists(st.text(), max_size=2).map(tuple))))
def test_the_pure_encoding_round_trips_any_record(state: State) -> None:
    assert decode(encode(state)) == state
    assert encode(decode(encode(state))) == encode(state)  # stable bytes: an unchanged record rewrites nothing new


@pytest.mark.parametrize("data", [b"[]", b'{"files": 3}', b"{not json", b"\xff"])
def test_decoding_a_broken_record_is_one_line(data: bytes) -> None:
    with pytest.raises(ValueError) as info:
        decode(data)
    assert "\n" not in str(info.value)
