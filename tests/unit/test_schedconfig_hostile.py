"""Hostile and broken sources: every one is a single ConfigError line naming
the file, never a traceback, and the input limits are enforced before a document is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, ForeignConfig, build_config
from patcher.core.schedconfig.gourl import url_problem
from patcher.core.schedconfig.schema import all_schemas, for_version
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.core.schedconfig.validate import problems_for
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import MAX_DOCUMENT_CHARS, load_documents, load_single
from patcher.core.yamltext import MAX_DEPTH, MAX_NODES
from tests.unit.test_schedconfig_source import make_configmap

V1 = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
EXT = "extenders:\n- urlPrefix: http://127.0.0.1:8888/\n  filterVerb: filter\n"


def refusal(tmp_path: Path, files: dict[str, str], version: str = "1.29.2") -> ConfigError:
    source = make_configmap(tmp_path / "cm", files)
    with pytest.raises(ConfigError) as err:
        build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version=version))
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    assert err.value.path is not None and err.value.path.startswith(str(source))
    return err.value


# ---- four typos a ConfigMap may carry, in both source forms ------------------------------------------------------

HOSTILE = {
    "ipv6 bracket never closed": ("extenders:\n- urlPrefix: http://[::1\n", "missing ']' in host"),
    "4301-digit integer": ("extenders:\n- urlPrefix: http://a/\n  weight: " + "9" * 4301 + "\n", "4301 characters"),
    "400 levels of nesting": ("extenders:\n- managedResources: " + "[" * 400 + "]" * 400 + "\n", "nested more than"),
    "!!set key": ("extenders:\n- urlPrefix: http://a/\n  ? !!set {a: null}\n  : x\n", "YAML tag tag:yaml.org,2002:set"),
    "!!set value": ("extenders: !!set {a}\n", "YAML tag tag:yaml.org,2002:set"),
    "hex integer of 5000 digits": ("extenders:\n- weight: 0x" + "f" * 5000 + "\n", "5002 characters"),
    "python tag": ("extenders:\n- weight: !!python/object:os.system x\n", "python/object"),
    "application tag": ("extenders:\n- weight: !foo 1\n", "YAML tag !foo"),
    "newline in urlPrefix": ('extenders:\n- urlPrefix: "http://a\\nb/"\n', "invalid control character"),
    "tab in urlPrefix": ('extenders:\n- urlPrefix: "http://a/\\tx"\n', "invalid control character"),
}


@pytest.mark.parametrize("form", ["extenders.yaml", "config.yaml"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_source_is_one_line(tmp_path: Path, case: str, form: str) -> None:
    body, expected = HOSTILE[case]
    text = body if form == "extenders.yaml" else V1 + body
    err = refusal(tmp_path, {form: text})
    assert expected in err.problem
    assert err.path == str(tmp_path / "cm" / form)


def test_the_2kb_nesting_costs_nothing(tmp_path: Path) -> None:
    text = V1 + "profiles: " + "[" * 400 + "]" * 400 + "\n"
    assert len(text) < 2100
    err = refusal(tmp_path, {"config.yaml": text})
    assert err.problem == f"line 3: nested more than {MAX_DEPTH} levels deep (the limit)"


def test_node_count_limit_stops_the_200k_item_list() -> None:
    text = "extenders:\n" + "- {}\n" * 200_000  # a 1 MiB source …
    text = text[:MAX_SOURCE_BYTES]  # … as much of it as a source file may hold
    with pytest.raises(ConfigError, match=rf"more than {MAX_NODES} YAML nodes") as err:
        load_documents(text, "/src/extenders.yaml")
    # root mapping, key and list are 3 nodes, each "- {}" one more: it stopped where the limit was crossed
    assert err.value.problem.startswith(f"line {MAX_NODES - 1}:")


def test_aliases_count_as_what_they_repeat() -> None:
    """Billion laughs: 9 aliases of 9 aliases … are few events but a huge document once expanded."""
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 6):
        prev, name = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    with pytest.raises(ConfigError, match="aliases count as what they repeat"):
        load_documents("\n".join(lines) + "\n", "/src/config.yaml")


def test_a_document_at_the_limits_is_accepted() -> None:
    deep = "k: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    load_documents(deep, "/src/config.yaml")
    wide = "k:\n" + "- 1\n" * (MAX_NODES - 3)
    load_documents(wide, "/src/config.yaml")
    assert load_single(wide, "/src/config.yaml")["k"][-1] == 1


def test_a_source_file_over_the_size_limit_is_refused_before_reading(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"extenders.yaml": EXT + "#" * MAX_SOURCE_BYTES})
    assert err.problem.startswith("too large (")


def test_a_foreign_config_over_the_document_limit_is_refused_before_parsing() -> None:
    """The foreign --config of a merge is read from the node, not through the source size check."""
    with pytest.raises(ConfigError, match=rf"too large \({MAX_DOCUMENT_CHARS + 1} characters"):
        load_single("#" * (MAX_DOCUMENT_CHARS + 1), "/etc/kubernetes/their-config.yaml")


def test_one_level_more_is_refused() -> None:
    deep = "k: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    with pytest.raises(ConfigError, match="nested more than"):
        load_documents(deep, "/src/config.yaml")


def test_a_64bit_number_in_any_spelling_is_not_a_long_number(tmp_path: Path) -> None:
    text = V1 + EXT + "parallelism: 16\nclientConnection:\n  qps: 3.4028234663852886e+38\n  burst: 0x7fffffff\n"
    source = make_configmap(tmp_path / "cm", {"config.yaml": text})
    rendered = build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version="1.29"))
    assert b"burst: 0x7fffffff" in rendered.files[rendered.main]


# ---- an entry that is not an extender: null is Go's zero Extender (no urlPrefix), a scalar a decode error ----

NOT_AN_EXTENDER = {
    "null": "extenders[0].urlPrefix: required field is missing or empty",
    "3": "extenders[0]: must be a mapping (Extender), got int 3",
    '"x"': "extenders[0]: must be a mapping (Extender), got string 'x'",
    "[]": "extenders[0]: must be a mapping (Extender), got a list",
}


@pytest.mark.parametrize("form", ["extenders.yaml", "config.yaml", "merged config.yaml", "foreign config"])
@pytest.mark.parametrize("entry", list(NOT_AN_EXTENDER))
def test_an_entry_that_is_not_an_extender_is_refused_by_name(tmp_path: Path, entry: str, form: str) -> None:
    bad = f"extenders: [{entry}]\n"
    files, foreign = {
        "extenders.yaml": ({"extenders.yaml": bad}, None),
        "config.yaml": ({"config.yaml": V1 + bad}, None),
        "merged config.yaml": ({"config.yaml": V1 + bad}, V1 + EXT),
        "foreign config": ({"extenders.yaml": EXT}, V1 + bad),
    }[form]
    source = make_configmap(tmp_path / "cm", files)
    with pytest.raises(ConfigError) as err:
        build_config(
            ConfigRequest(
                source_dir=source,
                host_config_dir="/etc/x",
                kube_version="1.34",
                foreign=ForeignConfig("/etc/f.yaml", text=foreign) if foreign else None,
            )
        )
    assert err.value.problem == NOT_AN_EXTENDER[entry]
    assert err.value.path == ("/etc/f.yaml" if form == "foreign config" else str(source / next(iter(files))))


@pytest.mark.parametrize(
    ("body", "problem"),
    [  # kube-scheduler 1.34-1.37 exit on these two ("name part must be non-empty", "ScorePlugin \"\" does not exist")
        (
            "extenders:\n- urlPrefix: http://a/\n  managedResources: [null]\n",
            "extenders[0].managedResources[0].name: required field is missing or empty",
        ),
        (
            "profiles:\n- plugins: {score: {enabled: [null]}}\n",
            "profiles[0].plugins.score.enabled[0].name: required field is missing or empty",
        ),
    ],
)
def test_a_null_list_entry_is_the_zero_struct(tmp_path: Path, body: str, problem: str) -> None:
    assert refusal(tmp_path, {"config.yaml": V1 + body}).problem == problem


@pytest.mark.parametrize("body", [
    "profiles: [null]\n",
    "profiles: [{pluginConfig: [null]}]\n",
    "profiles: [{plugins: {filter: {disabled: [null, {}]}, multiPoint: {disabled: [null]}}}]\n",
])
def test_null_entries_the_scheduler_starts_with_are_accepted(tmp_path: Path, body: str) -> None:
    """A zero profile (its name defaulted when it is the only one), a nameless pluginConfig entry and a nameless
    disabled plugin (it disables nothing) start kube-scheduler 1.34-1.37."""
    source = make_configmap(tmp_path / "cm", {"config.yaml": V1 + EXT + body})
    build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version="1.34"))


# ---- every problem is reported, not the first --------------------------------------------------------------


def test_a_misspelt_field_does_not_hide_a_bad_url(tmp_path: Path) -> None:
    text = "extenders:\n- urlPrefix: http://[::1\n  wieght: 5\n  prioritizeVerb: prioritize\n"
    err = refusal(tmp_path, {"extenders.yaml": text})
    assert "extenders[0].wieght: unknown field" in err.problem
    assert "did you mean 'weight'" in err.problem
    assert "extenders[0].urlPrefix: missing ']' in host" in err.problem
    assert "extenders[0].weight: must be > 0 when prioritizeVerb is set" in err.problem


def test_type_errors_and_rule_errors_together() -> None:
    schema = next(s for s in all_schemas() if s.api_version == "kubescheduler.config.k8s.io/v1")
    data = {
        "apiVersion": schema.api_version,
        "kind": "KubeSchedulerConfiguration",
        "parallelism": "many",
        "leaderElection": {"leaseDuration": "nonsense", "renewDeadline": "10s", "retryPeriod": "10s"},
        "extenders": [{"urlPrefix": "ftp://x/"}],
    }
    found = problems_for(data, schema)
    assert any(p.startswith("parallelism: must be an integer") for p in found)
    assert any(p.startswith("leaderElection.leaseDuration: must be a duration") for p in found)
    assert any(p.startswith("leaderElection.renewDeadline: must be greater than retryPeriod*1.2") for p in found)
    assert any(p.startswith("extenders[0].urlPrefix: unsupported protocol scheme 'ftp'") for p in found)


# ---- item 9: urlPrefix the way Go's url.Parse and the HTTP client take it ------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://[::1", "missing ']' in host"),
        ("http://[::1]x/", "invalid port 'x' after host"),
        ("http://a:xx/", "invalid port ':xx' after host"),
        ("http://a:0/", "port 0 is out of range"),
        ("http://a:70000/", "port 70000 is out of range"),
        ("http://a\nb/", "invalid control character '\\n'"),
        ("http://a/\x7f", "invalid control character '\\x7f'"),
        ("http://a b/", "invalid character ' ' in host name"),
        ("http://a{b}/", "invalid character '{' in host name"),
        ("http://a/%zz", "invalid URL escape '%zz'"),
        ("http://a/x%4", "invalid URL escape '%4'"),
        ("http://a%/", "invalid URL escape '%'"),
        ("http://a%41/", "invalid URL escape '%41'"),
        ("127.0.0.1:8888", "must be an http:// or https:// URL with a host (missing protocol scheme)"),
        ("://a/", "must be an http:// or https:// URL with a host (missing protocol scheme)"),
        ("http:/a/", "must be an http:// or https:// URL with a host (no '//' after the scheme)"),
        ("http:///x", "must be an http:// or https:// URL with a host (no host)"),
        ("http://:80/", "must be an http:// or https:// URL with a host (no host)"),
        ("unix:///run/x.sock", "unsupported protocol scheme 'unix'"),
        ("http://a/x?y=1", "must not contain '?' or '#'"),
        ("http://a/#f", "must not contain '?' or '#'"),
        ("http://us er@a/", "invalid userinfo"),
    ],
)
def test_url_prefix_refused_as_go_would(url: str, problem: str) -> None:
    found = url_problem(url)
    assert found is not None and problem in found


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8888",
        "http://127.0.0.1:8888/",
        "https://extender.kube-system.svc:8443/scheduler",
        "http://[::1]:8888/",
        "http://[fe80::1%25eth0]:8888/",
        "HTTP://EXAMPLE.com/",
        "http://user:pa%20ss@a:1/x/y%2F",
        "http://a:/",  # Go accepts an empty port and dials the scheme's default
        "http://\u00e9xample.com/",  # non-ASCII hosts are left to the resolver, as Go does
        "http://%C3%A9xample.com/",  # an escaped non-ASCII byte is allowed in a host
    ],
)
def test_url_prefix_that_go_accepts(url: str) -> None:
    assert url_problem(url) is None


# ---- the net under everything: no input escapes as anything but ConfigError ----------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=12) | st.integers(), inner, max_size=4),
    max_leaves=30,
)
_keys = st.sampled_from(
    ["apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "profiles", "extenders",
     "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds", "urlPrefix", "weight",
     "schedulerName", "plugins", "pluginConfig", "name", "args", "managedResources", "tlsConfig", "leaseDuration",
     "queueSort", "enabled", "disabled", "weight", "addedAffinity", "scoringStrategy", "shape", "resources",
     "defaultConstraints", "minCandidateNodesPercentage", "requiredDuringSchedulingIgnoredDuringExecution",
     "nodeSelectorTerms", "matchExpressions", "operator", "values", "type", "requestedToCapacityRatio"]
)
_plugin_names = st.sampled_from(
    ["NodeAffinity", "PodTopologySpread", "NodeResourcesFit", "InterPodAffinity", "VolumeBinding",
     "DefaultPreemption", "NodeResourcesBalancedAllocation", "PrioritySort", "EBSLimits"]
)
_shaped = st.recursive(
    _scalars | _plugin_names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(body=st.one_of(_values, _shaped))
def test_validation_never_raises_on_any_shape(body: Any) -> None:
    for schema in all_schemas():
        data = dict(body) if isinstance(body, dict) else {"extenders": body}
        data.update({"apiVersion": schema.api_version, "kind": schema.kind})
        for version in (None, KubeVersion(1, 25), KubeVersion(1, 36)):
            served = version is None or schema.serves(version)
            target = for_version(schema, version) if served and version is not None else schema
            found = problems_for(data, target)
            assert all(isinstance(line, str) and "\n" not in line for line in found)


@settings(max_examples=60, deadline=None)
@given(body=_shaped)
@example(body={"extenders": [None]})
@example(body={"extenders": [3]})
@example(body={"extenders": ["x"]})
@pytest.mark.parametrize("form", ["config.yaml", "extenders.yaml"])
def test_build_config_refuses_in_one_line_or_renders(
    tmp_path_factory: pytest.TempPathFactory, form: str, body: Any
) -> None:
    """Either form, any shape: a specific one-line refusal, never the catch-all of an input we did not foresee."""
    folder = tmp_path_factory.mktemp("cm")
    doc = dict(body) if isinstance(body, dict) else {"profiles": body}
    if form == "extenders.yaml":
        doc = {"extenders": doc.get("extenders", body)}
    else:
        doc.update({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"})
    (folder / form).write_text(json.dumps(doc))
    try:
        build_config(ConfigRequest(source_dir=folder, host_config_dir="/etc/x", kube_version="1.30"))
    except ConfigError as err:
        assert "\n" not in str(err) and err.path is not None
        assert "cannot use this source" not in err.problem


def test_an_unforeseen_error_still_becomes_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net: a bug of ours on some input must not crash-loop the agent on every node at once."""
    import patcher.core.schedconfig as schedconfig

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("unhashable type: 'CommentedMap'")

    monkeypatch.setattr(schedconfig, "_read_source", broken)
    err = refusal(tmp_path, {"extenders.yaml": EXT})
    assert err.path == str(tmp_path / "cm")
    assert err.problem.startswith("cannot use this source (TypeError: unhashable type: 'CommentedMap')")
