"""Version detection (image tag, --kube-version, API server fallback) and the version table it feeds."""

from __future__ import annotations

import re

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.schema import served_config_schemas, target_schema
from patcher.core.schedconfig.version import (
    KubeVersion,
    resolve_version,
    supported_version,
    version_from_image,
)

G = "kubescheduler.config.k8s.io"


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("registry.k8s.io/kube-scheduler:v1.29.4", "1.29.4"),
        ("k8s.gcr.io/kube-scheduler-amd64:v1.11.2", "1.11.2"),
        ("docker.io/rancher/hardened-kubernetes:v1.30.2-rke2r1-build20240717", "1.30.2"),
        ("registry.k8s.io/kube-scheduler:v1.28.0@sha256:" + "a" * 64, "1.28.0"),
        ("quay.io/coreos/hyperkube:v1.10.4_coreos.0", "1.10.4"),
        ("localhost:5000/kube-scheduler:v1.27.1", "1.27.1"),
        ("registry.aliyuncs.com/google_containers/kube-scheduler:v1.18.16", "1.18.16"),
    ],
)
def test_version_from_image(image: str, expected: str) -> None:
    version = version_from_image(image)
    assert version is not None and str(version) == expected


@pytest.mark.parametrize(
    "image",
    [
        "registry.k8s.io/kube-scheduler@sha256:" + "b" * 64,  # digest only
        "localhost:5000/kube-scheduler",  # a registry port is not a tag
        "kube-scheduler",
        "${hyperkube_image}",
        "{{ .Image }}",
        "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.25.7",  # scheduler-plugins tag, not a k8s version
        "registry.k8s.io/kube-scheduler:latest",
    ],
)
def test_images_without_a_kubernetes_version(image: str) -> None:
    assert version_from_image(image) is None


def test_image_tag_ignores_registry_port_and_digest() -> None:
    version = version_from_image("localhost:5000/a/b:v1.28@sha256:00")
    assert version is not None and str(version) == "1.28" and version.source == "image tag v1.28"
    assert version_from_image("localhost:5000/a/b") is None


def test_override_wins_over_image_and_fallback() -> None:
    version = resolve_version("registry.k8s.io/kube-scheduler:v1.29.4", "1.22", "v1.30.0")
    assert version.key == (1, 22) and version.source == "--kube-version"
    assert str(resolve_version(None, "v1.29.3", None)) == "1.29.3"


def test_image_wins_over_fallback() -> None:
    assert resolve_version("registry.k8s.io/kube-scheduler:v1.27.2", None, "v1.28.0").key == (1, 27)


def test_fallback_is_the_api_server_version() -> None:
    version = resolve_version("registry.k8s.io/kube-scheduler@sha256:" + "c" * 64, None, "v1.29.3+rke2r1")
    assert version.key == (1, 29) and version.source == "API server /version"


def test_unknown_version_says_how_to_fix() -> None:
    manifest = "/etc/kubernetes/manifests/kube-scheduler.yaml"
    with pytest.raises(ConfigError) as err:
        resolve_version("registry.k8s.io/kube-scheduler@sha256:" + "d" * 64, None, None, where=manifest)
    assert err.value.path == manifest
    assert "--kube-version" in err.value.problem and "has no Kubernetes version tag" in err.value.problem


def test_bad_override_is_refused_in_the_words_of_the_cli_check() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_version(None, "latest", None)
    assert err.value.problem == "--kube-version: not a Kubernetes version: 'latest' (expected e.g. 1.34 or v1.34.2)"
    with pytest.raises(ValueError) as cli:
        supported_version("latest")
    assert err.value.problem == f"--kube-version: {cli.value}"


def test_too_old_scheduler_is_refused() -> None:
    with pytest.raises(ConfigError, match="too old"):
        resolve_version("quay.io/coreos/hyperkube:v1.8.5_coreos.0", None, None)
    with pytest.raises(ConfigError) as err:  # an image tag below the supported range, as --kube-version is
        resolve_version("registry.k8s.io/kube-scheduler:v1.18.20", None, None)
    assert err.value.problem == (
        "kube-scheduler 1.18.20 (image tag v1.18.20) is too old: outside the supported range (supported: 1.19 to 1.37)")


def test_out_of_range_is_refused_in_the_words_of_the_cli_check() -> None:
    """One wording, from version._outside: resolve_version adds where the version came from, the CLI's check
    leaves that to argparse ("argument --kube-version: ...")."""
    with pytest.raises(ConfigError) as err:
        resolve_version(None, "1.18", None)
    with pytest.raises(ValueError) as cli:
        supported_version("1.18")
    range_ = "outside the supported range (supported: 1.19 to 1.37)"
    assert err.value.problem == f"kube-scheduler 1.18 (--kube-version) is too old: {range_}"
    assert str(cli.value) == f"kube-scheduler 1.18 is too old: {range_}"
    with pytest.raises(ValueError, match=re.escape(f"kube-scheduler 1.38.0 is too new: {range_}")):
        supported_version("v1.38.0")


# The table from the issue, in the supported range.
TABLE = {
    **{m: f"{G}/v1beta1" for m in (19, 20, 21)},
    22: f"{G}/v1beta2",
    23: f"{G}/v1beta3",
    24: f"{G}/v1beta3",
    **{m: f"{G}/v1" for m in range(25, 36)},
}


@pytest.mark.parametrize("minor", sorted(TABLE))
def test_version_table(minor: int) -> None:
    assert target_schema(KubeVersion(1, minor)).api_version == TABLE[minor]


@pytest.mark.parametrize(
    ("api", "first", "last"),
    [
        ("v1beta1", 19, 22),
        ("v1beta2", 22, 27),
        ("v1beta3", 23, 28),
        ("v1", 25, 40),
    ],
)
def test_served_ranges(api: str, first: int, last: int) -> None:
    for minor in range(19, 41):
        served = {s.api_version for s in served_config_schemas(KubeVersion(1, minor))}
        assert (f"{G}/{api}" in served) == (first <= minor <= last), (api, minor)
