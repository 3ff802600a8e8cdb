"""docs/scheduler-config.md says what the code does: the per-minor table, the limits and the ported rules."""

from __future__ import annotations

from pathlib import Path

from patcher.core.schedconfig.binary import facts_for
from patcher.core.schedconfig.rules import RULES
from patcher.core.schedconfig.schema import generated as generated_types
from patcher.core.schedconfig.schema import generated_minor, served_config_schemas, target_schema
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.core.schedconfig.version import SUPPORTED_MINORS, KubeVersion
from patcher.core.schedconfig.yamlio import MAX_DOCUMENT_CHARS
from patcher.core.yamltext import MAX_DEPTH, MAX_NODES, MAX_NUMBER_CHARS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scheduler-config.md").read_text(encoding="utf-8")


def _short(api_version: str) -> str:
    return api_version.rsplit("/", 1)[-1] if api_version.startswith("kubescheduler.") else api_version


def expected_rows() -> list[str]:
    rows = []
    for minor in range(SUPPORTED_MINORS[0][1], max(generated_types())[1] + 1):  # up to the newest generated minor
        version = KubeVersion(1, minor)
        target = target_schema(version)
        rendered = f"`{_short(target.api_version)}`"
        served = ", ".join(f"`{_short(s.api_version)}`" for s in served_config_schemas(version))
        generated = generated_minor(version) == version.key
        types = f"generated `kube-scheduler-1.{minor}.json`" if generated else "hand-written per apiVersion"
        facts = facts_for(minor)
        proof = f"the {facts.version} binary (oracle)" if facts is not None else "reading upstream source"
        rows.append(f"| 1.{minor} | {rendered} | {served} | {types} | upstream validation after defaults | {proof} |")
    return rows


def test_the_version_table_matches_the_code() -> None:
    table = [line for line in DOC.splitlines() if line.startswith("| 1.")]
    assert table == expected_rows()


def test_the_limits_match_the_code() -> None:
    assert f"| source file size | {MAX_SOURCE_BYTES // 1024} KiB |" in DOC
    assert f"| {MAX_DOCUMENT_CHARS // 1024} Ki characters |" in DOC
    assert f"| nesting depth | {MAX_DEPTH} |" in DOC
    assert f"count as what they repeat) | {MAX_NODES} |" in DOC
    assert f"| unquoted number length | {MAX_NUMBER_CHARS} characters |" in DOC


def test_every_ported_rule_names_its_upstream_function_in_the_docs() -> None:
    for rule in RULES:
        if rule.cls == "validation":
            function = rule.source.split(" (")[0].split()[-1].split(":")[0]
            assert function in DOC, function
