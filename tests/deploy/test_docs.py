"""One source of truth: every flag the docs name exists, and every default they quote is the one --help shows.

The docs are read as a user reads them: inline code spans in prose (fenced blocks hold other tools' commands
too). A flag of another program (kube-scheduler's, kubectl's) must be listed in ``FOREIGN`` with its owner, so
a renamed or removed flag of ours cannot linger in a sentence.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from patcher.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/operator-contract.md", "docs/configuration.md", "docs/scheduling-gates.md",
        "docs/alerts.md", "docs/benchmarks.md", "docs/development.md", "manifests/README.md",
        "manifests/uninstall/README.md"]
#: Flags of other programs that the docs name on purpose.
FOREIGN = {
    "--config": "kube-scheduler", "--leader-elect": "kube-scheduler", "--kube-api-qps": "kube-scheduler",
    "--policy-config-file": "kube-scheduler", "--profiling": "kube-scheduler",
    "--force": "kubectl delete", "--cascade": "kubectl delete", "--profile": "kubectl debug",
    "--port": "kube-scheduler", "--address": "kube-scheduler", "--scheduler-name": "kube-scheduler",
    "--algorithm-provider": "kube-scheduler", "--hard-pod-affinity-symmetric-weight": "kube-scheduler",
    "--feature-gates": "kube-scheduler", "--lock-object-": "kube-scheduler (--lock-object-*)",
    "--leader-elect-": "kube-scheduler (--leader-elect-*)", "--kube-api-": "kube-scheduler (--kube-api-*)",
    "--runtime-config": "kube-apiserver", "--pod-max-in-unschedulable-pods-duration": "kube-scheduler",
    "--pull": "podman build",
    "--dry-run": "helm", "--no-hooks": "helm", "--create-namespace": "helm", "--set-json": "helm",
}
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:=([^\s`]+))?")


def prose(text: str) -> str:
    """The text without fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def spans() -> list[tuple[str, str]]:
    """(doc, inline code span) for the spans in the docs' prose that are flags or our commands (a span that
    starts with another program, e.g. ``kubectl get events --field-selector ...``, is that program's)."""
    out = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", prose((ROOT / doc).read_text())):
            if span.startswith("-") or span.startswith("scheduler-patcher "):
                out.append((doc, span))
    return out


@pytest.fixture
def actions(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[argparse.Action]]:
    """Every option of every command, by flag, with the environment that would change defaults cleared."""
    import os

    for key in list(os.environ):
        if key.startswith("PATCHER_") or key in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE", "KUBECONFIG"):
            monkeypatch.delenv(key)
    out: dict[str, list[argparse.Action]] = {}
    for action in build_parser()._actions:
        for flag in action.option_strings:
            out.setdefault(flag, []).append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for option in sub._actions:
                    for flag in option.option_strings:
                        out.setdefault(flag, []).append(option)
    return out


def converted(action: argparse.Action, value: str) -> Any:
    return action.type(value) if callable(action.type) else value


def test_every_flag_named_in_the_docs_exists(actions: dict[str, list[argparse.Action]]) -> None:
    unknown, bad_values = [], []
    for doc, span in spans():
        for flag, value in FLAG.findall(span):
            if flag in FOREIGN:
                continue
            if flag not in actions:
                unknown.append(f"{doc}: `{span}`: {flag}")
                continue
            if value and not value.startswith("<"):
                choices = [a.choices for a in actions[flag] if a.choices]
                typed = [a for a in actions[flag] if callable(a.type)]
                if choices and not any(value in c for c in choices):
                    bad_values.append(f"{doc}: `{span}`: {value} is not one of {choices[0]}")
                for a in typed:
                    try:
                        converted(a, value)
                    except (argparse.ArgumentTypeError, ValueError):
                        bad_values.append(f"{doc}: `{span}`: {value} is not a valid value of {flag}")
    assert not unknown, "flags the CLI does not have:\n" + "\n".join(unknown)
    assert not bad_values, "\n".join(bad_values)


#: "`--flag`, default `x`", "`--flag` (default `x`", "`--flag` (env `PATCHER_FLAG`), default `x`"
QUOTED = re.compile(r"`(--[a-z][a-z0-9-]*)`(?: \(env `[A-Z_]+`\))?,? \(?default:? `([^`]+)`")
#: "`--flag` (default 10 min)", "`--flag` (60 s)"
DURATION = re.compile(r"`(--[a-z][a-z0-9-]*)` \((?:default )?(\d+) ?(s|min)\)")
#: A flag table (docs/configuration.md's): "| `--flag` | `value` | meaning |"
TABLE = re.compile(r"^\| `(--[a-z][a-z0-9-]*)` \| `([^`]*)` \|", re.M)


def quoted_defaults() -> list[tuple[str, str, str]]:
    """(doc, flag, value as the doc writes it)."""
    out = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        flat = " ".join(prose(text).split())  # sentences wrap across lines
        out += [(doc, flag, value) for flag, value in QUOTED.findall(flat)]
        out += [(doc, flag, f"{n}{'m' if unit == 'min' else 's'}") for flag, n, unit in DURATION.findall(flat)]
        out += [(doc, flag, value) for flag, value in TABLE.findall(text)]
    return out


def test_the_docs_quote_defaults_at_all() -> None:
    flags = {flag for _, flag, _ in quoted_defaults()}
    assert {"--manifest-dir", "--host-config-dir", "--restart-timeout", "--rollout-lease-duration",
            "--listen", "--annotation-prefix"} <= flags


def test_every_default_quoted_in_the_docs_is_the_one_help_shows(actions: dict[str, list[argparse.Action]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = []
    for doc, flag, value in quoted_defaults():
        if flag in FOREIGN:
            continue
        options = actions.get(flag, [])
        if value.startswith("$"):  # "default `$POD_NAMESPACE`, else `x`": an environment variable first
            continue
        if not any(a.default is not None and converted(a, str(a.default)) == converted(a, value) for a in options):
            shown = sorted({str(a.default) for a in options})
            wrong.append(f"{doc}: {flag} default `{value}`, --help says {shown}")
    assert not wrong, "\n".join(wrong)


def test_defaults_that_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = re.compile(r"`(--[a-z][a-z0-9-]*)`, default `\$([A-Z_]+)`, else `([^`]+)`")
    found = []
    for doc in DOCS:
        found += pattern.findall(" ".join(prose((ROOT / doc).read_text()).split()))
    assert found, "the contract no longer says where --namespace comes from"
    for flag, env, fallback in found:
        for value, expected in ((None, fallback), ("from-env", "from-env")):
            if value is None:
                monkeypatch.delenv(env, raising=False)
            else:
                monkeypatch.setenv(env, value)
            defaults = set()
            for action in build_parser()._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for sub in action.choices.values():
                        defaults |= {a.default for a in sub._actions if flag in a.option_strings}
            assert expected in defaults, (flag, env, defaults)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, spaces to dashes, punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_resolves() -> None:
    """The README and docs/ link into each other: every relative
    link names a file that exists, and every #anchor a heading of that file."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "manifests/README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and file.suffix == ".md":
                headings = {slug(h) for h in re.findall(r"(?m)^#+ (.+)$", prose(file.read_text()))}
                if anchor not in headings:
                    broken.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


# -- every doc: the flags, Helm values, metrics and repository files it names exist ------------------------

CHART = ROOT / "charts/scheduler-patcher"
#: README.md, docs/*.md, every README under manifests/, the chart's README: what a user reads.
ALL_DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
            *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "manifests").rglob("README.md")),
            "charts/scheduler-patcher/README.md"]
#: The top-level folders of this repository: a code span that starts with one names a file of ours.
REPO_DIRS = ("patcher", "tests", "docs", "manifests", "charts", "bench", "tools", "examples", "fuzz", ".ci")
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in REPO_DIRS)})/[\w./-]*)(.?)")
METRIC = re.compile(r"\bscheduler_patcher_[a-z0-9_]+")
FILE_SUFFIX = re.compile(r"\.(ya?ml|json|md|py|txt|tpl|sh|cfg|toml)$")


#: Where a doc's history begins: the modules as they were named before a move are not files any more.
HISTORY = ("## Old → new module map",)


def current(text: str) -> str:
    """``text`` without its history sections (see ``HISTORY``)."""
    for heading in HISTORY:
        text = text.split(heading, 1)[0]
    return text


def values_comments() -> str:
    """The comments of the chart's values.yaml, where each value is documented."""
    return "\n".join(line.split("#", 1)[1] for line in (CHART / "values.yaml").read_text().splitlines()
                     if "#" in line)


def all_spans(doc: str) -> list[str]:
    """Inline code spans of ``doc``'s prose, and every command line of its fenced blocks."""
    text = current((ROOT / doc).read_text())
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    return [*re.findall(r"`([^`\n]+)`", prose(text)), *(line for block in fenced for line in block.splitlines())]


def repo_paths(doc: str, text: str) -> list[str]:
    """Paths of this repository named in ``text`` (placeholders such as ``<yours>`` and globs left out), and, in
    a doc below the root, paths relative to its own folder (``base/daemonset.yaml`` in manifests/README.md)."""
    out = []
    for path, after in REPO_PATH.findall(text):
        if after in ("<", "*", "{", "$") or re.search(r"(?:^|[./-])N(?:[./-]|$)", path):
            continue  # a placeholder, a glob, or a numbered family (``1.N.json``)
        out.append(path.rstrip("./").split("::")[0])
    folder = (ROOT / doc).parent
    if folder != ROOT:
        for token in re.findall(r"(?<![\w./-])([\w-]+/[\w./-]*[\w/])(?![\w./<*{$-])", text):
            if (folder / token.split("/")[0]).is_dir() and token.split("/")[0] not in REPO_DIRS:
                out.append(str((folder / token.rstrip("/")).relative_to(ROOT)))
    return out


def test_every_repository_path_a_doc_names_exists() -> None:
    missing, seen = [], set()
    for doc in ALL_DOCS:
        for span in all_spans(doc):
            seen.update(repo_paths(doc, span))
            missing += [f"{doc}: `{span}`: {p}" for p in repo_paths(doc, span) if not (ROOT / p).exists()]
    assert {"manifests/uninstall/README.md", "patcher/core/lifecycle.py", "manifests/base/rbac-daemonset.yaml"} <= seen
    missing += [f"values.yaml: {p}" for p in repo_paths("charts/scheduler-patcher/values.yaml", values_comments())
                if not (ROOT / p).exists() and not (CHART / p).exists()]
    assert not missing, "files the repository does not have:\n" + "\n".join(missing)


def test_the_path_check_finds_a_missing_file() -> None:
    assert repo_paths("README.md", "see `manifests/overlays/kubeadmm` and manifests/overlays/<yours>") == [
        "manifests/overlays/kubeadmm"]
    assert repo_paths("manifests/README.md", "base/nope.yaml") == ["manifests/base/nope.yaml"]


def schema() -> dict[str, Any]:
    import json

    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def helm_value_known(path: list[str]) -> bool:
    """Whether ``a.b.c`` is a value of the chart: a property of the values schema all the way down, or inside a
    free-form map (``podAnnotations.x``, ``monitoring.prometheusRule.for.<alert>``)."""
    node = schema()
    for key in path:
        props = node.get("properties") or {}
        if key in props:
            node = props[key]
            continue
        extra = node.get("additionalProperties", True)
        return extra is not False and not props
    return True


def helm_values_in(text: str) -> list[str]:
    """``agent.restartTimeout``-like names in ``text`` whose first part is a top-level value of the chart."""
    tops = sorted(schema()["properties"], key=len, reverse=True)
    pattern = re.compile(rf"(?<![\w./$-])((?:{'|'.join(tops)})(?:\.[A-Za-z][A-Za-z0-9]*)+)(?!\.?[\w/-])")
    return [m for m in pattern.findall(text) if not FILE_SUFFIX.search(m)]


def test_every_helm_value_a_doc_names_exists() -> None:
    unknown, seen = [], set()
    for doc in ALL_DOCS:
        for span in all_spans(doc):
            seen.update(helm_values_in(span))
            unknown += [f"{doc}: `{span}`: {v}" for v in helm_values_in(span) if not helm_value_known(v.split("."))]
    assert {"restoreJob.timeout", "agent.restoreOnExit", "gatekeeper.admission.enabled"} <= seen
    unknown += [f"values.yaml: {v}" for v in helm_values_in(values_comments()) if not helm_value_known(v.split("."))]
    assert not unknown, "Helm values the chart does not have:\n" + "\n".join(unknown)


def test_the_helm_value_check_finds_a_removed_value() -> None:
    assert helm_values_in("set `restoreJob.controlPlaneNodes: 3` and agent.restartTimeout") == [
        "restoreJob.controlPlaneNodes", "agent.restartTimeout"]
    assert not helm_value_known(["restoreJob", "controlPlaneNodes"])
    assert helm_value_known(["agent", "restartTimeout"]) and helm_value_known(["podAnnotations", "example.com/x"])
    assert helm_values_in("extenders.yaml in the ConfigMap") == []


def test_every_metric_a_doc_names_is_exported() -> None:
    from tests.deploy.test_monitoring import exported

    names = exported()
    families = names | {n.rsplit("_", 1)[0] for n in names if n.endswith(("_bucket", "_count", "_sum"))}
    assert "scheduler_patcher_restart_seconds" in families and "scheduler_patcher_held" in families
    assert "scheduler_patcher_restarts_total" not in families  # a name that was never exported is caught
    unknown = []
    for doc in ALL_DOCS:
        text = (ROOT / doc).read_text()
        unknown += [f"{doc}: {m}" for m in sorted(set(METRIC.findall(text))) if m not in families]
    unknown += [f"values.yaml: {m}" for m in sorted(set(METRIC.findall(values_comments()))) if m not in families]
    assert not unknown, "metrics neither the agent nor the gatekeeper exports:\n" + "\n".join(unknown)


def test_every_flag_any_doc_or_the_values_comments_name_exists(actions: dict[str, list[argparse.Action]]) -> None:
    """The check above (``test_every_flag_named_in_the_docs_exists``) for the prose of every doc and the values'
    comments: a flag in a sentence or a span, ours unless it is listed as another program's."""
    unknown = []
    for doc in ALL_DOCS:
        for span in re.findall(r"`([^`\n]+)`", prose((ROOT / doc).read_text())):
            if span.startswith(("kubectl", "helm", "kube-", "crictl", "docker", "podman", "go ", "pip", "make",
                                "git", "etcd", "kubeadm", "promtool", "pytest", "python", "ruff", "mypy", "twine",
                                "bench/", "tools/", "main.py")):  # other programs, and our scripts' own flags
                continue
            unknown += [f"{doc}: `{span}`: {f}" for f, _ in FLAG.findall(span)
                        if f not in actions and f not in FOREIGN]
    for line in values_comments().splitlines():
        unknown += [f"values.yaml: {f}" for f, _ in FLAG.findall(line) if f not in actions and f not in FOREIGN]
    assert not unknown, "flags the CLI does not have:\n" + "\n".join(unknown)
