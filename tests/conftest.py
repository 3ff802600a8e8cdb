from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Under load (2 cores, a CPU hog, two xdist workers) one example can take seconds: a per-example deadline or the
# too-slow health check would then fail a test that proves nothing wrong. Example counts stay where each test
# sets them; a test's own @settings inherits this profile for everything it does not set.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def fixture_manifests() -> dict[str, str]:
    """Our own manifests, plus CRLF and missing-final-newline variants made from them."""
    out: dict[str, str] = {}
    for path in sorted((FIXTURES / "manifests").glob("*.yaml")):
        text = path.read_bytes().decode("utf-8")
        out[path.name] = text
        out[f"crlf-{path.name}"] = text.replace("\n", "\r\n")
        out[f"no-eol-{path.name}"] = text.rstrip("\n")
    return out


def corpus_manifests() -> list[Path]:
    folder = CORPUS / "manifests"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def write_configmap(folder: Path, files: dict[str, str]) -> None:
    """What the kubelet does on a ConfigMap update: a new timestamped folder, the ``..data`` symlink swapped
    by rename, and the visible names as symlinks through ``..data`` (no event on the visible files)."""
    gen = folder / f"..{time.monotonic_ns()}"
    gen.mkdir()
    for name, text in files.items():
        (gen / name).write_text(text)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(gen.name)
    os.replace(tmp, folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")


# API fixtures: each test module defines its own ``emu`` (a tests.harness.emu.kubeemu.KubeEmulator set up for it).


@pytest.fixture
def kubeconfig(emu: Any, tmp_path: Path) -> Path:
    path: Path = emu.write_kubeconfig(tmp_path / "kubeconfig")
    return path


@pytest.fixture
def api(emu: Any, tmp_path: Path) -> Iterator[Any]:
    from patcher.adapters.kube.client import ClientSettings, build_api_client

    client = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc")),
                                             timeout=(0.5, 1.0)))
    yield client
    client.close()


@pytest.fixture
def kubeadm_text() -> str:
    return (FIXTURES / "manifests" / "kubeadm.yaml").read_text()


# -- the real control plane (tests/harness/real/controlplane.py, built by `make real-k8s`) ----------------------

REAL_CLUSTER = "real_cluster"
REAL_KUBELET = "real_kubelet"
REAL_KUBEADM = "real_kubeadm"
#: The markers of the tests that run real components: one at a time on the machine (see `one_at_a_time`).
REAL_MARKERS = (REAL_CLUSTER, REAL_KUBELET, REAL_KUBEADM)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{REAL_CLUSTER}: runs on the real kube-apiserver/etcd of `make real-k8s`")
    config.addinivalue_line("markers", f"{REAL_KUBELET}: runs a real node (kubelet, containerd) of `make real-k8s`")
    config.addinivalue_line("markers", f"{REAL_KUBEADM}: a node made by the real `kubeadm init` of `make real-k8s` "
                                       "(`make test-real-kubeadm`, not `make test`)")
    config.addinivalue_line("markers", "real_bench: a bench's smoke run that builds a cluster of its own on the real "
                                       "components (`make test-real-bench`, not `make test`)")
    for kind, what in KINDS.items():
        config.addinivalue_line("markers", f"{kind}: {what} (set from the test's folder, tests/{kind}/)")
    config.addinivalue_line("markers", "sweep: a pure test run once per file of a whole corpus (../shared/corpus, "
                                       "every fixture): `make test-fast` leaves it out, `make test` runs it")


#: The folders tests are sorted into, by what a test needs to run; each test carries its folder's marker, so a kind
#: can be selected or left out across folders (`-m "not e2e"`) and a test moved between kinds changes no decorator.
KINDS = {
    "unit": "pure core logic on values, pyfakefs or a few files in tmp_path: no agent, emulator or server",
    "component": "one adapter or service on tmp_path, with the API emulator or a local server",
    "e2e": "the agent as a process, end to end, against the emulator and simulated kubelets",
    "real": "the real kube-apiserver, kube-scheduler or kubelet of `make real-k8s` (markers real_*)",
    "deploy": "what ships: the chart, the kustomize manifests, the Dockerfile, packaging and the docs",
}


#: pytest-timeout counts fixture set-up, and so the wait for the lock: a real test may wait for every other one.
REAL_TEST_TIMEOUT = 1800


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the group marks in this same hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real tests' timeout covers the lock's wait (prepended: it wins over a test's own, shorter one); each test
    gets its folder's kind marker.

    The real tests are one xdist group: one worker runs them in turn while the other runs the rest, where two
    workers would otherwise each pick one and one of them idle on the real-test lock."""
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in KINDS:
            item.add_marker(getattr(pytest.mark, folder))
        if any(item.get_closest_marker(m) for m in REAL_MARKERS):
            item.add_marker(pytest.mark.timeout(REAL_TEST_TIMEOUT), append=False)
            item.add_marker(pytest.mark.xdist_group("real"))


@pytest.fixture(autouse=True)
def _one_real_cluster_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if not any(request.node.get_closest_marker(m) for m in REAL_MARKERS):
        yield
        return
    from tests.harness.real.controlplane import one_at_a_time

    with one_at_a_time():
        yield


def _require_real_binaries() -> None:
    from tests.harness.real.controlplane import missing_reason

    why = missing_reason()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"real-cluster binaries missing under CI=true: {why}")
    pytest.skip(why)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`real_release` runs a test once per built release (newest first), or once to skip where none is."""
    if "real_release" in metafunc.fixturenames:
        from tests.harness.real.controlplane import built_releases

        versions = [b.version for b in built_releases()] or ["none"]
        metafunc.parametrize("real_release", versions, indirect=True, scope="session")


# An idle kube-apiserver and etcd take a fifth of a core (the watch cache's bookmarks, every second), which the
# other tests of a 2-core machine wait for: a control plane lives only as long as the tests that use it.


@pytest.fixture(scope="session")
def real_release(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The control plane of one built release (tests/harness/real/controlplane.ControlPlane), shared by the session's
    tests of that release: pytest runs them together, and ends this fixture (the control plane stops) before the
    next release's starts."""
    from tests.harness.real.controlplane import built_releases, control_plane

    _require_real_binaries()
    with control_plane(next(b for b in built_releases() if b.version == request.param)) as cp:
        yield cp


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[Any]:
    """The newest built release's control plane (tests/harness/real/controlplane.ControlPlane), shared by a module's
    tests."""
    from tests.harness.real.controlplane import built_releases, control_plane

    _require_real_binaries()
    with control_plane(built_releases()[0]) as cp:
        yield cp
