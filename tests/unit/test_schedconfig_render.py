"""Rendering: every row of the version table against golden files, the three source forms, flag carry-over,
content naming and reproducible bytes.

Set UPDATE_GOLDEN=1 to rewrite the golden files after an intended change (then review the diff).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, RenderedConfig, build_config
from patcher.core.schedconfig.yamlio import load_single
from tests.unit.test_schedconfig_source import fixture_text, make_configmap

GOLDEN = Path(__file__).parents[1] / "golden" / "schedconfig"
HOST_DIR = "/etc/kubernetes/scheduler-patcher"
KUBEADM_FLAGS = (
    "--authentication-kubeconfig=/etc/kubernetes/scheduler.conf",
    "--authorization-kubeconfig=/etc/kubernetes/scheduler.conf",
    "--bind-address=127.0.0.1",
    "--kubeconfig=/etc/kubernetes/scheduler.conf",
    "--leader-elect=true",
)
CSI_FILES = ("config.yaml", "policy.yaml", "config-19.yaml", "config-23.yaml", "config-29.yaml")


def build(source: Path, version: str, flags: tuple[str, ...] = KUBEADM_FLAGS, **extra: object) -> RenderedConfig:
    return build_config(ConfigRequest(source_dir=source, host_config_dir=HOST_DIR, kube_version=version,
                                      scheduler_flags=flags, **extra))  # type: ignore[arg-type]


@pytest.fixture
def extenders_source(tmp_path: Path) -> Path:
    return make_configmap(tmp_path / "cm", {"extenders.yaml": fixture_text("extenders.yaml")})


def check_golden(name: str, rendered: RenderedConfig) -> None:
    folder = GOLDEN / name
    main = rendered.files[rendered.main]
    if os.environ.get("UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_bytes(main)
    assert main.decode() == (folder / "config.yaml").read_text(encoding="utf-8")
    assert rendered.main == f"config-{hashlib.sha256(main).hexdigest()[:12]}.yaml"
    assert rendered.config_hash == hashlib.sha256(main).hexdigest()
    assert list(rendered.files) == [rendered.main]  # one file: its hash covers everything the scheduler reads


ROWS = [
    ("1.19.0", "kubescheduler.config.k8s.io/v1beta1"),
    ("1.21.1", "kubescheduler.config.k8s.io/v1beta1"),
    ("1.22.17", "kubescheduler.config.k8s.io/v1beta2"),
    ("1.23.5", "kubescheduler.config.k8s.io/v1beta3"),
    ("1.24.6", "kubescheduler.config.k8s.io/v1beta3"),
    ("1.25.0", "kubescheduler.config.k8s.io/v1"),
    ("1.29.4", "kubescheduler.config.k8s.io/v1"),
    ("1.33.0", "kubescheduler.config.k8s.io/v1"),
]


@pytest.mark.parametrize(("version", "api_version"), ROWS)
def test_version_table_rows_against_golden(extenders_source: Path, version: str, api_version: str) -> None:
    rendered = build(extenders_source, version)
    assert rendered.api_version == api_version
    assert rendered.form == "extenders.yaml"
    assert rendered.kube_version == version
    first_line = rendered.files[rendered.main].decode().splitlines()[0]  # names the source file it came from
    minor = ".".join(version.split(".")[:2])
    assert first_line == (f"# Rendered by scheduler-patcher from extenders.yaml for kube-scheduler {minor} "
                          f"({api_version}); do not edit.")
    check_golden(f"extenders-{minor}", rendered)


def test_same_input_same_bytes_wherever_the_source_is_mounted(tmp_path: Path) -> None:
    one = build(make_configmap(tmp_path / "a", {"extenders.yaml": fixture_text("extenders.yaml")}), "1.29.4")
    two = build(make_configmap(tmp_path / "b" / "deeper", {"extenders.yaml": fixture_text("extenders.yaml")}),
                "v1.29.9")
    assert one.files == two.files and one.config_hash == two.config_hash


def test_a_config_change_changes_the_hash(tmp_path: Path) -> None:
    text = fixture_text("extenders.yaml")
    one = build(make_configmap(tmp_path / "a", {"extenders.yaml": text}), "1.29")
    two = build(make_configmap(tmp_path / "b", {"extenders.yaml": text.replace("weight: 1", "weight: 2")}), "1.29")
    assert one.config_hash != two.config_hash and one.main != two.main


def test_version_from_the_image_and_rke2_kubeconfig(extenders_source: Path) -> None:
    rendered = build_config(ConfigRequest(
        source_dir=extenders_source, host_config_dir="/var/lib/rancher/rke2/agent/scheduler-patcher",
        image="docker.io/rancher/hardened-kubernetes:v1.30.2-rke2r1-build20240717",
        scheduler_flags=("--kubeconfig=/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig",),
    ))
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["clientConnection"]["kubeconfig"] == "/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig"
    assert rendered.api_version.endswith("/v1") and "image tag v1.30.2-rke2r1-build20240717" in rendered.notes[0]


def test_go_runner_flags_and_scheduler_name(extenders_source: Path) -> None:
    flags = ("--log-file=/var/log/kube-scheduler.log", "--also-stdout", "/usr/local/bin/kube-scheduler",
             "--kubeconfig=/var/lib/kube-scheduler/kubeconfig", "--scheduler-name=second", "--profiling=false")
    rendered = build(extenders_source, "1.28.0", flags)
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["clientConnection"] == {"kubeconfig": "/var/lib/kube-scheduler/kubeconfig"}
    assert data["profiles"] == [{"schedulerName": "second"}]
    assert data["enableProfiling"] is False
    assert "leaderElection" not in data


BOTH_PROFILE_FLAGS = ("--kubeconfig=/etc/kubernetes/scheduler.conf", "--scheduler-name=second",
                      "--hard-pod-affinity-symmetric-weight=5")
IN_PROFILE_0 = {"schedulerName": "second",
                "pluginConfig": [{"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": 5}}]}


def test_two_flags_into_the_first_profile_both_land_there(extenders_source: Path) -> None:
    rendered = build(extenders_source, "1.21.0", BOTH_PROFILE_FLAGS)
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["profiles"] == [IN_PROFILE_0]
    assert "carried --scheduler-name into profiles[0].schedulerName" in rendered.notes


def test_two_flags_fill_the_first_profile_of_a_config_without_profiles(tmp_path: Path) -> None:
    config = COMPLETE.replace("/v1\n", "/v1beta1\n")
    rendered = build(make_configmap(tmp_path / "cm", {"config.yaml": config}), "1.21.0", BOTH_PROFILE_FLAGS)
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["profiles"] == [IN_PROFILE_0]
    assert not any("has its own profiles" in n for n in rendered.notes)


def test_a_config_with_its_own_profiles_gets_neither_flag(tmp_path: Path) -> None:
    config = COMPLETE.replace("/v1\n", "/v1beta1\n") + "profiles:\n- schedulerName: mine\n"
    rendered = build(make_configmap(tmp_path / "cm", {"config.yaml": config}), "1.21.0", BOTH_PROFILE_FLAGS)
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["profiles"] == [{"schedulerName": "mine"}]
    assert [n for n in rendered.notes if "has its own profiles" in n] == [
        "config.yaml has its own profiles; --scheduler-name is not carried into them",
        "config.yaml has its own profiles; --hard-pod-affinity-symmetric-weight is not carried into them"]


def test_unknown_version_is_refused(extenders_source: Path) -> None:
    with pytest.raises(ConfigError, match="--kube-version"):
        build_config(ConfigRequest(source_dir=extenders_source, host_config_dir=HOST_DIR,
                                   image="registry.k8s.io/kube-scheduler@sha256:" + "e" * 64))


def test_host_config_dir_must_be_absolute(extenders_source: Path) -> None:
    with pytest.raises(ConfigError, match="absolute node path"):
        build_config(ConfigRequest(source_dir=extenders_source, host_config_dir="etc/x", kube_version="1.29"))


def test_invalid_extenders_source_names_file_and_field(tmp_path: Path) -> None:
    source = make_configmap(tmp_path / "cm", {"extenders.yaml": "extenders:\n- urlPrefix: http://a\n"
                                                                "  prioritizeVerb: p\n"})
    with pytest.raises(ConfigError) as err:
        build(source, "1.29")
    assert err.value.path == str(source / "extenders.yaml")
    assert err.value.problem == "extenders[0].weight: must be > 0 when prioritizeVerb is set (got None)"


# ---- config.yaml: used as is ----------------------------------------------------------------------------

COMPLETE = """# ours, with a comment
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
leaderElection:
  leaderElect: true
extenders:
- urlPrefix: http://127.0.0.1:8889
  filterVerb: filter
"""


def test_complete_config_is_used_as_is(tmp_path: Path) -> None:
    source = make_configmap(tmp_path / "cm", {"config.yaml": COMPLETE})
    rendered = build(source, "1.29.4")
    assert rendered.form == "config.yaml" and rendered.api_version == "kubescheduler.config.k8s.io/v1"
    text = rendered.files[rendered.main].decode()
    assert text == ("# Rendered by scheduler-patcher from config.yaml for kube-scheduler 1.29 "
                    "(kubescheduler.config.k8s.io/v1); do not edit.\n" + COMPLETE)
    assert list(rendered.files) == [rendered.main]


def test_complete_config_gets_only_the_missing_flag_settings(tmp_path: Path) -> None:
    config = COMPLETE.replace("leaderElection:\n  leaderElect: true\n", "").replace(
        "/etc/kubernetes/scheduler.conf", "/etc/kubernetes/other.conf")
    source = make_configmap(tmp_path / "cm", {"config.yaml": config})
    rendered = build(source, "1.29.4")
    data = load_single(rendered.files[rendered.main].decode(), rendered.main)
    assert data["leaderElection"] == {"leaderElect": True}  # filled in from --leader-elect
    assert data["clientConnection"]["kubeconfig"] == "/etc/kubernetes/other.conf"  # the user's value stays
    assert any("--kubeconfig='/etc/kubernetes/scheduler.conf' is not used" in n for n in rendered.notes)
    assert "# ours, with a comment" in rendered.files[rendered.main].decode()


def test_complete_config_with_an_apiversion_the_node_does_not_serve(tmp_path: Path) -> None:
    source = make_configmap(tmp_path / "cm", {"config.yaml": COMPLETE.replace("/v1\n", "/v1beta3\n")})
    with pytest.raises(ConfigError) as err:
        build(source, "1.29.0")
    assert err.value.path == str(source / "config.yaml")
    assert "kubescheduler.config.k8s.io/v1beta3 is not served by kube-scheduler 1.29.0" in err.value.problem
    assert build(source, "1.28.0").api_version == "kubescheduler.config.k8s.io/v1beta3"


def test_complete_config_in_json_with_crlf(tmp_path: Path) -> None:
    text = '{\r\n  "apiVersion": "kubescheduler.config.k8s.io/v1",\r\n  "kind": "KubeSchedulerConfiguration"\r\n}\r\n'
    rendered = build(make_configmap(tmp_path / "cm", {"config.yaml": text}), "1.30")
    out = rendered.files[rendered.main].decode()
    assert "\nclientConnection:\n  kubeconfig: /etc/kubernetes/scheduler.conf\n" in out  # rewritten as YAML
    assert '"kind"' not in out


# ---- the csi-baremetal-operator layout ----------------------------------------------------------------------


@pytest.fixture
def csi_source(tmp_path: Path) -> Path:
    return make_configmap(tmp_path / "csi", {n: fixture_text(f"csi-baremetal/{n}") for n in CSI_FILES})


@pytest.mark.parametrize(
    ("version", "picked", "api_version"),
    [
        ("1.19.0", "config-19.yaml", "kubescheduler.config.k8s.io/v1beta1"),
        ("1.22.3", "config-19.yaml", "kubescheduler.config.k8s.io/v1beta1"),
        ("1.23.5", "config-23.yaml", "kubescheduler.config.k8s.io/v1beta3"),
        ("1.28.2", "config-23.yaml", "kubescheduler.config.k8s.io/v1beta3"),
        ("1.29.0", "config-29.yaml", "kubescheduler.config.k8s.io/v1"),
        ("1.32.0", "config-29.yaml", "kubescheduler.config.k8s.io/v1"),
    ],
)
def test_csi_layout_picks_the_file_for_the_version(
    csi_source: Path, version: str, picked: str, api_version: str
) -> None:
    rendered = build(csi_source, version)
    assert rendered.form == "csi-baremetal-operator"
    assert rendered.files[rendered.main].decode().startswith(f"# Rendered by scheduler-patcher from {picked} for ")
    assert rendered.api_version == api_version
    text = rendered.files[rendered.main].decode()
    assert text.endswith(fixture_text(f"csi-baremetal/{picked}"))  # unchanged, comments included
    assert text.startswith(f"# Rendered by scheduler-patcher from {picked} for kube-scheduler")


def test_csi_layout_on_1_18_is_refused_as_too_old(csi_source: Path) -> None:
    """The operator's config.yaml + policy.yaml are for 1.18 and older, outside the supported range."""
    with pytest.raises(ConfigError, match=r"kube-scheduler 1\.18\.16 \(--kube-version\) is too old"):
        build(csi_source, "1.18.16")


def test_csi_layout_without_the_file_for_this_version(tmp_path: Path) -> None:
    files = {n: fixture_text(f"csi-baremetal/{n}") for n in ("config.yaml", "policy.yaml", "config-19.yaml")}
    source = make_configmap(tmp_path / "old-operator", files)
    with pytest.raises(ConfigError) as err:
        build(source, "1.25.0")
    assert err.value.path == str(source / "config-23.yaml")
    assert err.value.problem.startswith("source file not found: the csi-baremetal-operator layout uses config-23.yaml")
    assert "kube-scheduler 1.25.0 (--kube-version)" in err.value.problem  # the version it detected
    assert "config-19.yaml, config.yaml, policy.yaml" in err.value.problem


@pytest.mark.parametrize("text", ["y", "No", "ON", "off", "null", "~", "0x1F", "1e3", "12:30", ".inf"])
def test_strings_a_yaml_1_1_reader_would_retype_are_quoted(text: str) -> None:
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    from patcher.core.schedconfig.yamlio import safe_scalar

    assert isinstance(safe_scalar(text), DoubleQuotedScalarString)
    assert not isinstance(safe_scalar("scheduler-extender"), DoubleQuotedScalarString)
