"""Merging our extenders into a config the scheduler already runs with: none, foreign extenders (with a stale
copy of ours), profiles and comments, and the merges that must be refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, ForeignConfig, RenderedConfig, build_config
from patcher.core.schedconfig.yamlio import load_single, to_plain
from tests.unit.test_schedconfig_source import fixture_text, make_configmap

HOST_DIR = "/etc/kubernetes/scheduler-patcher"
FOREIGN_NODE = "/etc/kubernetes/sched/config.yaml"
FLAGS = ("--kubeconfig=/etc/kubernetes/scheduler.conf", "--leader-elect=true", "--profiling=false")


def merge(source: Path, foreign_text: str | None, version: str = "1.29.4") -> RenderedConfig:
    foreign = ForeignConfig("/etc/sched/config.yaml", FOREIGN_NODE, foreign_text)
    return build_config(ConfigRequest(source_dir=source, host_config_dir=HOST_DIR, kube_version=version,
                                      scheduler_flags=FLAGS, foreign=foreign))


def main_data(rendered: RenderedConfig) -> dict[str, object]:
    data = to_plain(load_single(rendered.files[rendered.main].decode(), rendered.main))
    assert isinstance(data, dict)
    return data


def first_line(rendered: RenderedConfig) -> str:
    """The header of the main file: which source it came from, and the config it was merged into."""
    return rendered.files[rendered.main].decode().splitlines()[0]


def urls(rendered: RenderedConfig) -> list[str]:
    extenders = main_data(rendered)["extenders"]
    assert isinstance(extenders, list)
    return [e["urlPrefix"] for e in extenders]


def comments(text: str) -> list[str]:
    return [m.group(0).strip() for m in re.finditer(r"#.*", text)]


@pytest.fixture
def ours(tmp_path: Path) -> Path:
    return make_configmap(tmp_path / "cm", {"extenders.yaml": fixture_text("extenders.yaml")})


def test_no_foreign_text_means_no_merge(ours: Path) -> None:
    rendered = merge(ours, None)
    assert " merged into " not in first_line(rendered)
    assert main_data(rendered)["enableProfiling"] is False  # flags are carried when we own the whole config


def test_foreign_extenders_kept_in_order_and_stale_copy_replaced(ours: Path) -> None:
    rendered = merge(ours, fixture_text("foreign-extenders.yaml"))
    assert urls(rendered) == [
        "http://127.0.0.1:9251",  # theirs, first
        "http://127.0.0.1:8889",  # ours, where the stale copy (with a trailing slash) stood
        "https://gpu-extender.kube-system.svc:9443/scheduler",
        "https://tas.telemetry.svc:9001",  # theirs, still last
    ]
    ours_now = main_data(rendered)["extenders"][1]  # type: ignore[index]
    assert ours_now["weight"] == 1 and ours_now["prioritizeVerb"] == "prioritize"  # not the stale weight: 3
    text = rendered.files[rendered.main].decode()
    assert "# Storage extender, installed by the storage team." in text
    assert "# Telemetry extender." in text
    assert first_line(rendered).startswith(
        f"# Rendered by scheduler-patcher from extenders.yaml merged into {FOREIGN_NODE} ")
    assert any("replaced stale copies of our extenders: http://127.0.0.1:8889" in n for n in rendered.notes)
    assert "enableProfiling" not in main_data(rendered)  # flags were already ignored under the foreign --config


def test_profiles_plugins_and_comments_are_kept(ours: Path) -> None:
    foreign = fixture_text("foreign-profiles-comments.yaml")
    rendered = merge(ours, foreign)
    text = rendered.files[rendered.main].decode()
    assert text.startswith(
        f"# Rendered by scheduler-patcher from extenders.yaml merged into {FOREIGN_NODE} for kube-scheduler 1.29 "
        "(kubescheduler.config.k8s.io/v1); do not edit.\n"
    )
    assert comments(text)[1:] == comments(foreign)  # every comment, in order
    assert text.split("\n", 1)[1].startswith(foreign)  # its own layout: byte for byte, ours appended after it
    before = to_plain(load_single(foreign, "f"))
    after = main_data(rendered)
    assert {k: v for k, v in after.items() if k != "extenders"} == before  # every other field untouched
    assert urls(rendered) == ["http://127.0.0.1:8889", "https://gpu-extender.kube-system.svc:9443/scheduler"]
    assert "\n    - schedulerName: batch-scheduler\n" in text  # the file's own (4, 2) list style


def test_foreign_file_is_not_modified(ours: Path) -> None:
    foreign = fixture_text("foreign-extenders.yaml")
    copy = str(foreign)
    merge(ours, foreign)
    assert foreign == copy


def test_merging_twice_gives_the_same_bytes(ours: Path) -> None:
    once = merge(ours, fixture_text("foreign-extenders.yaml"))
    again = merge(ours, once.files[once.main].decode())  # our own output read back as the foreign config
    assert again.files == once.files


def test_conflicting_binder_is_refused(ours: Path) -> None:
    with pytest.raises(ConfigError) as err:
        merge(ours, fixture_text("foreign-binder.yaml"), "1.27.0")
    assert err.value.path == FOREIGN_NODE
    assert err.value.problem.startswith(
        "cannot merge extenders.yaml into this config: extenders: at most one extender may set bindVerb, found 2 "
        "(extenders[0], extenders[2]) (extenders[0] from this file, extenders[1] from extenders.yaml, "
        "extenders[2] from extenders.yaml)"
    )


def test_duplicate_managed_resource_is_refused(ours: Path) -> None:
    foreign = fixture_text("foreign-extenders.yaml").replace("topolvm.io/capacity", "example.com/gpu")
    with pytest.raises(ConfigError, match=re.escape("duplicate extender managed resource 'example.com/gpu'")):
        merge(ours, foreign)


def test_foreign_api_version_not_served_is_refused(ours: Path) -> None:
    with pytest.raises(ConfigError) as err:
        merge(ours, fixture_text("foreign-binder.yaml"), "1.29.0")
    assert err.value.path == FOREIGN_NODE
    assert "kubescheduler.config.k8s.io/v1beta3 is not served by kube-scheduler 1.29.0" in err.value.problem


def test_foreign_config_in_an_older_served_version_keeps_its_api_version(ours: Path) -> None:
    foreign = fixture_text("foreign-binder.yaml").replace("  bindVerb: bind\n", "")
    rendered = merge(ours, foreign, "1.27.3")
    assert rendered.api_version == "kubescheduler.config.k8s.io/v1beta3"
    assert main_data(rendered)["apiVersion"] == "kubescheduler.config.k8s.io/v1beta3"


def test_api_version_mismatch_with_a_complete_source_is_refused(tmp_path: Path) -> None:
    source = make_configmap(tmp_path / "cm", {"config.yaml": fixture_text("csi-baremetal/config-23.yaml")})
    foreign = fixture_text("foreign-extenders.yaml")
    expected = ("apiVersion mismatch: this config is kubescheduler.config.k8s.io/v1 but the source config.yaml is "
                "kubescheduler.config.k8s.io/v1beta3")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        merge(source, foreign, "1.27.0")


def test_csi_layout_merges_the_picked_files_extenders(tmp_path: Path) -> None:
    names = ("config.yaml", "policy.yaml", "config-19.yaml", "config-23.yaml", "config-29.yaml")
    source = make_configmap(tmp_path / "csi", {n: fixture_text(f"csi-baremetal/{n}") for n in names})
    rendered = merge(source, fixture_text("foreign-extenders.yaml"), "1.30.1")
    assert rendered.form == "csi-baremetal-operator"
    assert urls(rendered) == ["http://127.0.0.1:9251", "http://127.0.0.1:8889", "https://tas.telemetry.svc:9001"]
    assert first_line(rendered).startswith("# Rendered by scheduler-patcher from config-29.yaml merged into ")
    assert "merge takes only the extenders of config-29.yaml; not merged: leaderElection, clientConnection" in (
        rendered.notes)


def test_invalid_foreign_config_is_refused_with_its_path(ours: Path) -> None:
    foreign = fixture_text("foreign-extenders.yaml").replace("weight: 2", "weight: 0")
    with pytest.raises(ConfigError) as err:
        merge(ours, foreign)
    assert err.value.path == FOREIGN_NODE
    assert err.value.problem == "extenders[2].weight: must be > 0 when prioritizeVerb is set (got 0)"


def test_a_foreign_config_of_1_18_and_older_is_refused(ours: Path) -> None:
    """v1alpha1 (and its legacy Policy) is outside the supported range: refused, not merged."""
    foreign = "apiVersion: kubescheduler.config.k8s.io/v1alpha1\nkind: KubeSchedulerConfiguration\n"
    with pytest.raises(ConfigError, match=r"apiVersion: 'kubescheduler\.config\.k8s\.io/v1alpha1' is not a known"):
        merge(ours, foreign, "1.19.0")

