"""``plan``/``apply --check-extenders``: one line per extender (URL, answered or the error, time taken), and an
apply that writes nothing while an extender that is not ignorable does not answer. Real local servers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.commands.cli import main
from tests.conftest import write_configmap
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.extservers import ExtenderServer
from tests.harness.helpers import MANIFEST, node_folders


@pytest.fixture
def server() -> Iterator[ExtenderServer]:
    with ExtenderServer() as s:
        yield s


@pytest.fixture
def node(tmp_path: Path) -> Path:
    node_folders(tmp_path, source=None)  # the test writes its own source
    return tmp_path


def extenders(node: Path, *entries: str) -> None:
    write_configmap(node / "src", {"extenders.yaml": "extenders:\n" + "".join(f"- {e}\n" for e in entries)})


def run(node: Path, *argv: str) -> list[str]:
    return [*argv, "--host-root", str(node / "node"), "--source", str(node / "src")]


def test_plan_prints_one_line_per_extender_only_when_asked(node: Path, server: ExtenderServer,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    hole = BlackHole()
    try:
        extenders(node, f"{{urlPrefix: '{server.url}', filterVerb: filter}}",
                  f"{{urlPrefix: 'http://127.0.0.1:{hole.port}', filterVerb: filter, httpTimeout: 200ms, "
                  "ignorable: true}")
        assert main(run(node, "plan")) == 2
        assert "# extender" not in capsys.readouterr().out  # off by default: a laptop dry run calls nobody
        assert server.bodies == []
        assert main(run(node, "plan", "--check-extenders")) == 2  # plan's exit codes stay the same
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# extender")]
        assert len(lines) == 2
        assert re.fullmatch(rf"# extender {re.escape(server.url)}/filter: answered in \d+ ms", lines[0])
        assert re.fullmatch(rf"# extender http://127\.0\.0\.1:{hole.port}/filter: no answer within 0\.2s "
                            r"\(after [\d.]+ m?s\)", lines[1])
        assert main(run(node, "plan", "--check-extenders", "-o", "json")) == 2
        doc = json.loads(capsys.readouterr().out)
        assert [(e["url"], e["answered"], e["ignorable"]) for e in doc["extenders"]] == [
            (f"{server.url}/filter", True, False), (f"http://127.0.0.1:{hole.port}/filter", False, True)]
    finally:
        hole.close()


def test_apply_writes_nothing_while_a_required_extender_does_not_answer(node: Path, server: ExtenderServer,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    original = (node / "node" / MANIFEST).read_bytes()
    extenders(node, f"{{urlPrefix: '{server.url}', filterVerb: fail}}")
    assert main(run(node, "apply", "--check-extenders")) == 1
    err = capsys.readouterr().err
    assert f"extender {server.url}/fail: HTTP 500" in err
    assert err.splitlines()[-1] == (f"scheduler-patcher: error: not writing: extender {server.url}/fail does not "
                                    "answer: HTTP 500; nothing was changed")
    assert (node / "node" / MANIFEST).read_bytes() == original
    assert not (node / "node/etc/kubernetes/scheduler-patcher").exists()
    # an ignorable one that fails is reported, and the write goes ahead
    extenders(node, f"{{urlPrefix: '{server.url}', filterVerb: fail, ignorable: true}}")
    assert main(run(node, "apply", "--check-extenders", "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["changed"] and doc["extenders"][0]["error"] == "HTTP 500"
    assert (node / "node" / MANIFEST).read_bytes() != original
