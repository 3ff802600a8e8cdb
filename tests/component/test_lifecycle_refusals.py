"""Whatever a ConfigMap typo makes the parser or renderer raise, the agent
refuses it in one line with state Failed, changes nothing on disk, and keeps running (a fix brings it back)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from patcher.core.settings import Files
from patcher.core.status import NodeState
from patcher.services.runner import build_agent
from tests.conftest import write_configmap
from tests.harness.helpers import EXTENDERS as GOOD
from tests.harness.helpers import KUBEADM, MANIFEST, metric, node_folders
from tests.harness.settings import build_settings

TYPOS = {
    "unclosed IPv6 bracket": GOOD.replace("http://127.0.0.1:8889", "http://[::1"),
    "4301-digit integer": GOOD.replace("weight: 1", "weight: " + "9" * 4301),
    "400 levels of nesting": "extenders: " + "[" * 400 + "]" * 400 + "\n",
    "!!set key": "extenders:\n- ? !!set {a: null}\n  : 1\n",
}


@pytest.mark.parametrize("typo", sorted(TYPOS))
def test_a_typo_is_a_one_line_refusal_and_the_agent_keeps_running(
        tmp_path: Path, typo: str, caplog: pytest.LogCaptureFixture) -> None:
    root, src = node_folders(tmp_path, source=TYPOS[typo])
    config = build_settings(files=Files(source=src, host_root=root), check_extenders=False, no_api=True)
    agent = build_agent(config, None).agent  # as `run --no-api` builds it
    with caplog.at_level(logging.INFO, logger="patcher.services.agent"):
        assert agent.start()
    phase = agent.node.phase  # a local, so the check below does not narrow agent.node.phase for the rest of the test
    assert phase == NodeState.FAILED and agent.health.state == "Failed"
    assert (root / MANIFEST).read_bytes() == KUBEADM  # nothing changed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage() and not errors[0].exc_info
    assert agent.node.record.message and "nothing was changed" in agent.node.record.message
    assert metric(agent.metrics, "scheduler_patcher_source_refused") == 1  # the SourceRefused alert's gauge
    assert metric(agent.metrics, "scheduler_patcher_config_info", config_hash="", source_hash="") is None
    write_configmap(src, {"extenders.yaml": GOOD})
    agent.reconcile("source changed")
    assert metric(agent.metrics, "scheduler_patcher_source_refused") == 0
    assert metric(agent.metrics, "scheduler_patcher_config_info", config_hash=agent.node.record.config_hash,
                  source_hash=agent.node.record.source_hash) == 1
    assert b"--config=" in (root / MANIFEST).read_bytes()
    assert agent.node.phase == NodeState.READY  # no API, no local check: live at once
    assert agent.shutdown() == 0
    assert (root / MANIFEST).read_bytes() == KUBEADM

