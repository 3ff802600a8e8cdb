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

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/operator-contract.md", "docs/configuration.md", "docs/scheduling-gates.md",
        "docs/alerts.md", "docs/benchmarks.md", "docs/development.md", "manifests/README.md",
        "manifests/uninstall/README.md"]
#: Flags of other programs that the docs name on purpose.
FOREIGN = {
    "--config": "kube-scheduler", "--leader-elect": "kube-scheduler", "--kube-api-qps": "kube-scheduler",
    "--policy-config-file": "kube-scheduler", "--profiling": "kube-scheduler",
    "--force": "kubectl delete", "--profile": "kubectl debug",
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
    """The README and docs/ link into each other (issue 35 moved the README's depth into docs/): every relative
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
