"""Strict validation: one failing example per rule, and the messages name the file, field path and rule."""

from __future__ import annotations

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.rules import qualified_name_problem
from patcher.core.schedconfig.validate import check_served, validate_document, validate_extenders_file
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import load_single

V1 = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
GOOD_EXTENDER = "- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n"


def problem(text: str, *, path: str = "/src/config.yaml") -> str:
    with pytest.raises(ConfigError) as err:
        validate_document(load_single(text, path), path)
    assert err.value.path == path
    return err.value.problem


def test_valid_v1_config_passes() -> None:
    text = V1 + (
        "clientConnection:\n  kubeconfig: /etc/kubernetes/scheduler.conf\n  qps: 50.5\n"
        "leaderElection:\n  leaderElect: true\n  leaseDuration: 15s\n  renewDeadline: 10s\n  retryPeriod: 2s\n"
        "profiles:\n- schedulerName: default-scheduler\n- schedulerName: other\n"
        "extenders:\n" + GOOD_EXTENDER + "  prioritizeVerb: prioritize\n  weight: 2\n  httpTimeout: 1m30s\n"
        "  tlsConfig:\n    certFile: /etc/kubernetes/pki/extender.crt\n    keyFile: /etc/kubernetes/pki/extender.key\n"
    )
    schema = validate_document(load_single(text, "c.yaml"), "c.yaml")
    assert schema.api_version == "kubescheduler.config.k8s.io/v1"


# base64 of a PEM block (BEGIN and END lines): what the PEM check looks for
PEM_KEY = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCkFBQUEKLS0tLS1FTkQgUFJJVkFURSBLRVktLS0tLQo="


def test_extender_tls_data_must_be_pem() -> None:
    """kube-scheduler 1.34-1.37 exit on certData that holds no PEM block ('tls: failed to find any PEM data in
    certificate input', as the oracle found); the config used to pass here with base64 of 'ABC'."""
    text = V1 + "extenders:\n" + GOOD_EXTENDER + "  tlsConfig:\n    certData: QUJD\n    keyData: " + PEM_KEY + "\n"
    assert problem(text).startswith("extenders[0].tlsConfig.certData: no PEM data in it")
    assert "rule extender.tlsPEM" in problem(text)
    header_only = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="  # a BEGIN line alone: no block, the binary exits too
    assert problem(text.replace("QUJD", header_only)).startswith("extenders[0].tlsConfig.certData: no PEM data")


def test_unknown_top_level_field() -> None:
    assert problem(V1 + "algorithmSource:\n  provider: DefaultProvider\n").startswith(
        "algorithmSource: unknown field (strict decoding: kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration"
    )


def test_unknown_extender_field_suggests_the_right_one() -> None:
    text = V1 + "extenders:\n- urlPrefix: http://a\n  enableHttps: true\n"
    assert "extenders[0].enableHttps: unknown field" in (found := problem(text))
    assert "did you mean 'enableHTTPS'?" in found


def test_field_types() -> None:
    text = V1 + "clientConnection:\n  qps: fast\nleaderElection:\n  leaderElect: \"yes\"\nextenders:\n" + (
        GOOD_EXTENDER + "  weight: \"1\"\n"
    )
    found = problem(text)
    assert "clientConnection.qps: must be a number, got string 'fast'" in found
    assert "leaderElection.leaderElect: must be true or false" in found
    assert "extenders[0].weight: must be an integer" in found


def test_url_prefix_must_be_a_url() -> None:
    found = problem(V1 + "extenders:\n- urlPrefix: 127.0.0.1:8889\n  filterVerb: filter\n")
    assert found.startswith("extenders[0].urlPrefix: must be an http:// or https:// URL with a host")


def test_url_prefix_is_required() -> None:
    assert "extenders[0].urlPrefix: required field is missing or empty" in problem(V1 + "extenders:\n- weight: 1\n")


def test_weight_must_be_positive_when_prioritize_is_set() -> None:
    text = V1 + "extenders:\n- urlPrefix: http://a\n  prioritizeVerb: prioritize\n  weight: 0\n"
    assert problem(text) == "extenders[0].weight: must be > 0 when prioritizeVerb is set (got 0)"


def test_at_most_one_binder() -> None:
    text = V1 + "extenders:\n- urlPrefix: http://a\n  bindVerb: bind\n- urlPrefix: http://b\n  bindVerb: bind\n"
    assert "extenders: at most one extender may set bindVerb, found 2 (extenders[0], extenders[1])" in problem(text)


def test_http_timeout_must_be_a_duration() -> None:
    assert "extenders[0].httpTimeout: must be a duration" in problem(
        V1 + "extenders:\n- urlPrefix: http://a\n  httpTimeout: 15 seconds\n")
    assert "must be a duration string such as 15s, got int 15000000000" in problem(
        V1 + "extenders:\n- urlPrefix: http://a\n  httpTimeout: 15000000000\n")


def test_managed_resource_names_are_qualified() -> None:
    text = V1 + "extenders:\n- urlPrefix: http://a\n  managedResources:\n  - name: gpu\n"
    assert "extenders[0].managedResources[0].name: 'gpu' must be a qualified extended resource name" in problem(text)
    assert qualified_name_problem("Example.com/gpu") is not None
    assert qualified_name_problem("example.com/gpu-mem_2") is None


def test_managed_resources_are_unique_across_extenders() -> None:
    text = V1 + (
        "extenders:\n- urlPrefix: http://a\n  managedResources:\n  - name: example.com/gpu\n"
        "- urlPrefix: http://b\n  managedResources:\n  - name: example.com/gpu\n"
    )
    assert "extenders[1].managedResources[0].name: duplicate extender managed resource 'example.com/gpu' " \
        "(also managed by extenders[0])" in problem(text)


def test_tls_config_fields() -> None:
    assert "extenders[0].tlsConfig.certFiel: unknown field" in problem(
        V1 + "extenders:\n- urlPrefix: https://a\n  tlsConfig:\n    certFiel: /c\n")
    missing_key = "extenders[0].tlsConfig: a client certificate needs both cert and key; keyFile/keyData is missing"
    assert missing_key in problem(V1 + "extenders:\n- urlPrefix: https://a\n  tlsConfig:\n    certFile: /c\n")
    assert "extenders[0].tlsConfig.caData: must be base64 text" in problem(
        V1 + "extenders:\n- urlPrefix: https://a\n  tlsConfig:\n    caData: '-----BEGIN CERTIFICATE-----'\n")


def test_profiles_have_unique_scheduler_names() -> None:
    # Upstream fills the default name only for a single profile (SetDefaults_KubeSchedulerConfiguration), so the
    # old expectation here (an unnamed profile counted as default-scheduler beside another one) was wrong.
    text = V1 + "profiles:\n- schedulerName: default-scheduler\n- schedulerName: default-scheduler\n"
    assert problem(text) == (
        "profiles[1].schedulerName: 'default-scheduler' is already used by profiles[0]; schedulerName must be unique"
    )
    assert "profiles[0].schedulerName: required" in problem(V1 + "profiles:\n- schedulerName: ''\n")


def test_unknown_plugin_extension_point() -> None:
    text = V1 + "profiles:\n- plugins:\n    unreserve:\n      enabled:\n      - name: X\n"
    assert problem(text).startswith("profiles[0].plugins.unreserve: unknown field")


def test_kubeconfig_must_be_absolute() -> None:
    found = problem(V1 + "clientConnection:\n  kubeconfig: REPLACE_ME_WITH_KUBE_CONFIG_PATH\n")
    assert found.startswith("clientConnection.kubeconfig: must be an absolute path")


def test_leader_election_periods() -> None:
    found = problem(V1 + "leaderElection:\n  leaseDuration: 10s\n  renewDeadline: 15s\n")
    assert found == "leaderElection.leaseDuration: must be greater than renewDeadline (10s <= 15s)"


def test_ranges() -> None:
    found = problem(V1 + "parallelism: 0\npercentageOfNodesToScore: 101\n")
    assert "parallelism: should be an integer value greater than zero" in found  # upstream's wording
    assert "percentageOfNodesToScore: not in valid range [0-100]" in found


def test_a_legacy_policy_is_refused() -> None:
    """kind: Policy was read by kube-scheduler 1.18 and older only, outside the supported range."""
    text = "apiVersion: v1\nkind: Policy\nextenders:\n- urlPrefix: http://a\n"
    assert problem(text) == "not a KubeSchedulerConfiguration (kind is 'Policy')"


def test_document_shape() -> None:
    assert "2 YAML documents" in problem(V1 + "---\n" + V1)
    assert problem("- a\n") == "not a KubeSchedulerConfiguration: the document is a list"
    assert problem("apiVersion: v1\nkind: Pod\n") == "not a KubeSchedulerConfiguration (kind is 'Pod')"
    assert "apiVersion: 'kubescheduler.config.k8s.io/v2' is not a known" in problem(
        "apiVersion: kubescheduler.config.k8s.io/v2\nkind: KubeSchedulerConfiguration\n")
    assert "invalid YAML" in problem(V1 + "extenders: [\n")
    assert "invalid YAML" in problem(V1 + "kind: KubeSchedulerConfiguration\n")  # duplicate key


def test_served_check_names_both_versions() -> None:
    schema = validate_document(load_single(V1.replace("/v1", "/v1beta3"), "c.yaml"), "c.yaml")
    with pytest.raises(ConfigError) as err:
        check_served(schema, KubeVersion(1, 29, 4, source="image tag v1.29.4"), "/src/config.yaml")
    assert err.value.problem.startswith(
        "apiVersion: kubescheduler.config.k8s.io/v1beta3 is not served by kube-scheduler 1.29.4 (image tag v1.29.4); "
        "it is served by 1.23–1.28; kube-scheduler 1.29 serves kubescheduler.config.k8s.io/v1"
    )
    check_served(schema, KubeVersion(1, 28), "/src/config.yaml")


def test_extenders_file() -> None:
    good = load_single("extenders:\n" + GOOD_EXTENDER, "e.yaml")
    assert validate_extenders_file(good, "e.yaml").api_version == "kubescheduler.config.k8s.io/v1"
    for text, message in [
        ("extenders: []\n", "extenders: must list at least one extender"),
        ("extenders:\n" + GOOD_EXTENDER + "profiles: []\n", "profiles: unknown field"),
        ("apiVersion: v1\n", "extenders: required field is missing or empty"),
        ("extenders:\n- urlPrefix: http://a\n  httpTimeout: 15000000000\n", "extenders[0].httpTimeout: must be"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate_extenders_file(load_single(text, "/src/extenders.yaml"), "/src/extenders.yaml")
