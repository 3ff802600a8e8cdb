"""The fast paths of config rendering give exactly what the slow ones give.

libyaml reads the limits' events and our own output; the pure round-trip parser stays the reference. Caches
are keyed by exact text (and version): a changed byte or version always renders again, and a warm cache
renders what a cold one does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, RenderedConfig, _parsed_extenders, build_config, render, yamlio
from patcher.core.schedconfig.validate import check_served, validate_document
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import load_documents, load_plain, load_single, to_plain
from patcher.core.yamltext import MAX_DEPTH, MAX_NODES, libyaml_loader
from tests.conftest import write_configmap
from tests.unit.test_schedconfig_source import make_configmap

CORPUS = Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus" / "configs"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scheduler-config"
HOST_DIR = "/etc/kubernetes/scheduler-patcher"

needs_libyaml = pytest.mark.skipif(libyaml_loader("a: 1\n") is None, reason="ruamel.yaml.clib is not installed")


def corpus_texts() -> list[str]:
    files = sorted(CORPUS.glob("*")) if CORPUS.is_dir() else []
    return [f.read_text(encoding="utf-8") for f in files + sorted(EXAMPLES.glob("*.yaml")) if f.is_file()]


HOSTILE = [
    "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "a:\n" + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(1, MAX_DEPTH + 2)),
    "a: &a [" + ", ".join(["x"] * 80) + "]\n" + "".join(f"b{i}: *a\n" for i in range(MAX_NODES // 80 + 2)),
    "n: " + "9" * 65 + "\n",
    "n: '" + "9" * 65 + "'\n",  # quoted: a string, not a number
    "n: !!str " + "9" * 65 + "\n",
    "t: !!set {a, b}\n",
    "t: !custom x\n",
    "t: !!binary aGk=\n",
    "a: [1, 2\n",  # a parse error
    "a: b: c\n",
    "\tkey: 1\n",
    "- a\nb: 1\n",
    "%YAML 1.1\n---\na: yes\n",
    "---\na: 1\n---\nb: 2\n",
    "",
    "a: 1\nb: \u2028c\n",  # a line break libyaml counts differently: the pure path
]


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except ConfigError as exc:
        return "refused", str(exc)


@contextmanager
def pure_only() -> Iterator[None]:
    """The reference: every path without its shortcuts, on the pure parser alone (libyaml is not offered)."""
    with mock.patch.object(yamlio, "libyaml_loader", lambda text: None):  # the name yamlio calls
        yield


def load_outcome(text: str) -> tuple[str, Any]:
    return outcome(lambda: [to_plain(d) for d in load_documents(text, "f.yaml")])


def reference_documents(text: str) -> tuple[str, Any]:
    with pure_only():
        return load_outcome(text)


@pytest.mark.sweep
@pytest.mark.parametrize("text", HOSTILE + corpus_texts())
def test_the_limits_read_from_libyaml_decide_as_the_pure_parser_did(text: str) -> None:
    assert load_outcome(text) == reference_documents(text)


yaml_chars = st.lists(st.sampled_from([*list("ab01x- :{}[],&*!'\"#\n\t%|>?"), "  ", "\n  ", "0x1F", "9" * 70]),
                      max_size=40).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(yaml_chars)
def test_limits_decide_as_before_on_any_text(text: str) -> None:
    assert load_outcome(text) == reference_documents(text)


def reference_load(text: str) -> tuple[str, Any]:
    with pure_only():
        return outcome(lambda: to_plain(load_single(text, "f.yaml")))


@needs_libyaml
@pytest.mark.sweep
@pytest.mark.parametrize("text", HOSTILE + corpus_texts())
def test_plain_load_is_the_round_trip_loads_data(text: str) -> None:
    assert outcome(lambda: load_plain(text, "f.yaml")) == reference_load(text)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                    st.sampled_from(["yes", "no", "on", "0x1F", "0o17", "017", "1e3", "1_000", "~", "null", ".inf",
                                     "2026-11-23", "12:30:00", "True", "-", "'q'", "a: b", "#c"]))
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                         max_leaves=20)


@needs_libyaml
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(documents, st.sampled_from(["block", "flow"]))
def test_plain_load_agrees_on_any_document(data: Any, style: str) -> None:
    from ruamel.yaml import YAML

    y = YAML(typ="safe", pure=True)
    y.default_flow_style = style == "flow"
    import io

    buf = io.StringIO()
    y.dump({"doc": data}, buf)
    text = buf.getvalue()
    assert outcome(lambda: load_plain(text, "f.yaml")) == reference_load(text)


@pytest.mark.sweep
@pytest.mark.parametrize("text", [t for t in HOSTILE + corpus_texts() if t.strip()])
@pytest.mark.parametrize("version", [KubeVersion(1, 17), KubeVersion(1, 31)])
def test_the_output_check_answers_as_the_round_trip_check_did(text: str, version: KubeVersion) -> None:
    def reference() -> str:  # _check_output without its shortcuts
        data = load_single(text, "out.yaml")
        schema = validate_document(data, "out.yaml", version=version)
        check_served(schema, version, "out.yaml")
        return schema.api_version

    render._check_output.cache_clear()
    assert outcome(lambda: render._check_output(text, "out.yaml", version).api_version) == outcome(reference)
    assert outcome(lambda: render._check_output(text, "out.yaml", version).api_version) == outcome(reference)


# -- caches: a changed byte or version renders again; warm equals cold -----------------------------------


EXTENDERS = (EXAMPLES / "extenders.yaml").read_text()


def build(source: Path, version: str) -> RenderedConfig:
    return build_config(ConfigRequest(source_dir=source, host_config_dir=HOST_DIR, kube_version=version))


def cold(source: Path, version: str) -> RenderedConfig:
    render._check_output.cache_clear()
    _parsed_extenders.cache_clear()
    return build(source, version)


def test_a_changed_source_byte_or_version_renders_again(tmp_path: Path) -> None:
    src = make_configmap(tmp_path / "cm", {"extenders.yaml": EXTENDERS})
    first = cold(src, "1.31")
    assert build(src, "1.31") == first  # warm
    assert "weight: 1\n" in EXTENDERS
    write_configmap(src, {"extenders.yaml": EXTENDERS.replace("weight: 1\n", "weight: 2\n")})  # the swap
    changed = build(src, "1.31")
    assert changed.config_hash != first.config_hash and b"weight: 2\n" in changed.files[changed.main]
    assert changed == cold(src, "1.31")
    older = build(src, "1.22")
    assert older.api_version != changed.api_version and older == cold(src, "1.22")
    assert build(src, "1.31") == changed


def test_a_refused_source_is_refused_again_from_a_warm_cache(tmp_path: Path) -> None:
    bad = EXTENDERS.replace("weight: 1\n", "weight: heavy\n")
    src = make_configmap(tmp_path / "cm", {"extenders.yaml": bad})
    first = outcome(lambda: cold(src, "1.31"))
    assert first[0] == "refused" and "weight" in first[1]
    assert outcome(lambda: build(src, "1.31")) == first


def test_the_cached_extenders_are_not_shared_with_callers(tmp_path: Path) -> None:
    src = make_configmap(tmp_path / "cm", {"extenders.yaml": EXTENDERS})
    path = str(src / "extenders.yaml")
    cached = _parsed_extenders(EXTENDERS, path)
    from patcher.core.schedconfig import _read_source
    from patcher.core.schedconfig.source import FORM_EXTENDERS, detect_form

    form = detect_form(src)
    assert form.form == FORM_EXTENDERS
    got = _read_source(src, form, KubeVersion(1, 31), merge=False)
    assert got.extenders is not None
    got.extenders[0]["weight"] = 99  # a caller that edits its copy
    assert _parsed_extenders(EXTENDERS, path) == cached and cached[0].get("weight") != 99


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(weight=st.integers(1, 100000), timeout=st.sampled_from(["1s", "15s", "2m30s", "500ms"]),
       url=st.sampled_from(["http://127.0.0.1:8889", "https://ext.example:8443/api", "http://[::1]:80"]),
       version=st.sampled_from(["1.19", "1.22", "1.25", "1.31"]), warm_first=st.booleans())
def test_warm_caches_render_what_cold_ones_do(tmp_path_factory: pytest.TempPathFactory, weight: int, timeout: str,
                                              url: str, version: str, warm_first: bool) -> None:
    text = (f"extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  weight: {weight}\n"
            f"  httpTimeout: {timeout}\n")
    src = make_configmap(tmp_path_factory.mktemp("cm"), {"extenders.yaml": text})
    if warm_first:
        build(src, version)
    warm = outcome(lambda: build(src, version))
    assert warm == outcome(lambda: cold(src, version))


def test_the_output_check_is_cached_per_version(tmp_path: Path) -> None:
    src = make_configmap(tmp_path / "cm", {"extenders.yaml": EXTENDERS})
    text = cold(src, "1.31").files[cold(src, "1.31").main].decode()
    assert render._check_output(text, "out.yaml", KubeVersion(1, 31)).api_version.endswith("/v1")
    with pytest.raises(ConfigError, match=r"1\.17"):  # v1 is not served by 1.17: the warm entry is not reused
        render._check_output(text, "out.yaml", KubeVersion(1, 17))
