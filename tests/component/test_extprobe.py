"""The extender probe against real servers on 127.0.0.1: HTTP, HTTPS with a CA made here, mutual TLS, a port
that accepts TCP and never answers, a refused port, a name that does not resolve, a 500, a 200 that is not JSON.

The targets come from rendered config text, the way the agent gets them; TLS files are node paths below a
host root (``local`` maps them), as on a real node.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from patcher.adapters.extprobe import probe, probe_all
from patcher.core import extprobe
from patcher.core.extprobe import Result, Target, blocking, summary, targets
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.extservers import ExtenderServer, Pki


def config(*extenders: str) -> dict[str, bytes]:
    """A rendered KubeSchedulerConfiguration with these extender entries (YAML flow mappings)."""
    body = "".join(f"- {e}\n" for e in extenders)
    return {"config-0123456789ab.yaml": ("apiVersion: kubescheduler.config.k8s.io/v1\n"
                                         "kind: KubeSchedulerConfiguration\nextenders:\n" + body).encode()}


def one(*extender: str) -> Target:
    found = targets(config(*extender))
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The CA below a host root, at the node path /etc/extender/pki."""
    host = tmp_path_factory.mktemp("host")
    return Pki.make(host / "etc/extender/pki")


def host_local(pki: Pki) -> tuple[str, Callable[[str], str]]:
    """The host root and the node-path-to-local mapping the agent's file system gives."""
    host = pki.folder.parents[2]
    return str(host), (lambda p: str(host) + p)


@pytest.fixture
def http_server() -> Iterator[ExtenderServer]:
    with ExtenderServer() as s:
        yield s


# --- the pure part -----------------------------------------------------------------------------------


def test_targets_read_every_spelling_and_keep_kube_schedulers_tls_rules() -> None:
    files = config(
        '{urlPrefix: "http://a:1/x/", filterVerb: filter, prioritizeVerb: prio, httpTimeout: 250ms, ignorable: true}',
        '{urlPrefix: "https://b:2", prioritizeVerb: prioritize, enableHTTPS: true, nodeCacheCapable: true}',
        '{urlPrefix: "https://c:3", filterVerb: f, tlsConfig: {caFile: /ca.crt, insecure: true}}',
        '{urlPrefix: "http://d:4", bindVerb: bind, preemptVerb: preempt}',
    )
    # the legacy Policy spelling (enableHttps, httpTimeout in nanoseconds), in a second file
    legacy = {"urlPrefix": "http://e:5", "filterVerb": "filter", "enableHttps": False, "httpTimeout": 2_000_000_000}
    files["policy.json"] = json.dumps({"kind": "Policy", "extenders": [legacy]}).encode()
    a, b, c, d, e = targets(files)
    assert (a.url, a.timeout, a.ignorable) == ("http://a:1/x/filter", 0.25, True)
    assert json.loads(a.body)["Nodes"]["items"] == [] and "NodeNames" not in json.loads(a.body)
    assert b.url == "https://b:2/prioritize" and b.timeout == extprobe.DEFAULT_TIMEOUT
    assert json.loads(b.body)["NodeNames"] == [] and "Nodes" not in json.loads(b.body)
    assert b.tls.insecure  # kube-scheduler: enableHTTPS without a CA does not verify the server
    assert c.problem == "tlsConfig sets both a CA and insecure: kube-scheduler refuses that combination"
    assert d.verb == "" and not d.problem
    assert (e.url, e.timeout) == ("http://e:5/filter", 2.0)


def test_results_say_what_blocks_a_write_and_read_as_one_line_each() -> None:
    ok = Result("http://a/filter", False, 0.012)
    down = Result("http://b/filter", False, 5.0, error="no answer within 5s")
    soft = Result("http://c/filter", True, 0.003, error="connection refused")
    skipped = Result("http://d", False, 0.0, error="no filter or prioritize verb", skipped=True)
    assert blocking([ok, down, soft, skipped]) == [down]
    assert [r.line() for r in (ok, down, soft)] == [
        "http://a/filter: answered in 12 ms", "http://b/filter: no answer within 5s (after 5.0 s)",
        "http://c/filter: connection refused (after 3 ms)"]
    assert summary([ok, down, soft, skipped]) == ("extender http://b/filter does not answer: no answer within 5s; "
                                                  "extender http://c/filter does not answer: connection refused")


# --- HTTP ----------------------------------------------------------------------------------------------


def test_an_extender_that_answers_gets_a_harmless_filter_call(http_server: ExtenderServer) -> None:
    result = probe(one(f'{{urlPrefix: "{http_server.url}/scheduler", filterVerb: filter, bindVerb: bind}}'))
    assert result.answered and result.error == "" and result.line().startswith(f"{http_server.url}/scheduler/filter")
    [(path, body)] = http_server.bodies
    args = json.loads(body)
    assert path == "/scheduler/filter" and args["Nodes"]["items"] == []
    assert args["Pod"]["metadata"]["name"] == "scheduler-patcher-probe" and not args["Pod"]["spec"].get("volumes")


def test_a_500_and_a_200_that_is_not_json_are_not_answers(http_server: ExtenderServer) -> None:
    assert probe(one(f'{{urlPrefix: "{http_server.url}", filterVerb: fail}}')).error == "HTTP 500"
    html = probe(one(f'{{urlPrefix: "{http_server.url}", filterVerb: html}}'))
    assert html.error == "HTTP 200 but the body is not JSON ('<html>it works</html>')"


def test_a_port_that_accepts_and_never_answers_times_out_at_the_extenders_own_timeout() -> None:
    hole = BlackHole()
    try:
        target = one(f'{{urlPrefix: "http://127.0.0.1:{hole.port}", filterVerb: filter, httpTimeout: 200ms}}')
        assert probe(target).error == "no answer within 0.2s"
        [r] = probe_all([target])  # the hard deadline of probe_all gives the same verdict
        assert r.error == "no answer within 0.2s" and not r.answered
    finally:
        hole.close()


def test_a_refused_port_and_a_name_that_does_not_resolve() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        refused = probe(one(f'{{urlPrefix: "http://127.0.0.1:{port}", filterVerb: filter, httpTimeout: 2s}}'))
    assert refused.error == "connection refused"
    # .invalid never resolves (RFC 6761); the lookup is bounded by the probe's deadline either way
    [unresolved] = probe_all([one('{urlPrefix: "http://extender.invalid:8889", filterVerb: filter, httpTimeout: 2s}')])
    assert unresolved.error.startswith("cannot resolve extender.invalid") or \
        unresolved.error == "no answer within 2s", unresolved.error


def test_probe_all_runs_every_extender_and_can_be_cancelled(http_server: ExtenderServer) -> None:
    hole = BlackHole()
    try:
        slow = one(f'{{urlPrefix: "http://127.0.0.1:{hole.port}", filterVerb: filter, httpTimeout: 30s}}')
        fast = one(f'{{urlPrefix: "{http_server.url}", filterVerb: filter}}')
        cancel = threading.Event()
        threading.Timer(0.1, cancel.set).start()  # SIGTERM while a probe waits: nobody waits 30 s
        results = probe_all([fast, slow], cancel=cancel)
        assert [r.answered for r in results] == [True, False] and results[1].error == "cancelled"
    finally:
        hole.close()


# --- HTTPS ---------------------------------------------------------------------------------------------


def test_https_with_the_ca_file_from_the_host_root(pki: Pki) -> None:
    _, local = host_local(pki)
    with ExtenderServer(pki) as server:
        ok = probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, enableHTTPS: true, '
                       'tlsConfig: {caFile: /etc/extender/pki/ca.crt}}'), local=local)
        assert ok.answered, ok.error
        # a CA the server's certificate does not chain to: the handshake fails as the scheduler's would
        other = Pki.make(pki.folder.parent / "other")
        bad = probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, '
                        f'tlsConfig: {{caData: {base64.b64encode(other.path("ca.crt").read_bytes()).decode()}}}}}'))
        assert bad.error.startswith("TLS: certificate verify failed"), bad.error
        # enableHTTPS with no CA: kube-scheduler does not verify, so neither does the probe
        assert probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, enableHTTPS: true}}')).answered


def test_server_name_checks_the_certificate_against_another_name(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path / "pki", server_names="DNS:extender.example")
    ca = f'caFile: {pki.path("ca.crt")}'
    with ExtenderServer(pki) as server:
        assert probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, '
                         f'tlsConfig: {{{ca}, serverName: extender.example}}}}')).answered
        mismatch = probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, tlsConfig: {{{ca}}}}}'))
        assert mismatch.error.startswith("TLS: "), mismatch.error
        assert "127.0.0.1" in mismatch.error or "mismatch" in mismatch.error


def test_mutual_tls_with_a_client_certificate_from_files_or_inline(pki: Pki) -> None:
    _, local = host_local(pki)
    with ExtenderServer(pki, client_ca=True) as server:
        files = ("tlsConfig: {caFile: /etc/extender/pki/ca.crt, certFile: /etc/extender/pki/client.crt, "
                 "keyFile: /etc/extender/pki/client.key}")
        assert probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, {files}}}'),
                     local=local).answered

        def b64(name: str) -> str:
            return base64.b64encode(pki.path(name).read_bytes()).decode()

        inline = f"tlsConfig: {{caData: {b64('ca.crt')}, certData: {b64('client.crt')}, keyData: {b64('client.key')}}}"
        assert probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, {inline}}}')).answered
        ca_only = f"tlsConfig: {{caData: {b64('ca.crt')}}}"
        without = probe(one(f'{{urlPrefix: "{server.url}", filterVerb: filter, {ca_only}}}'))
        assert not without.answered and without.error, without


def test_a_rendered_file_past_the_yaml_limits_names_no_target() -> None:
    # The probe reads through the one bounded loader: 10^5 levels would crash the composer, not just fail.
    deep = b"extenders: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
    good = b"extenders:\n- urlPrefix: http://127.0.0.1:8888/\n  filterVerb: filter\n"
    assert [t.url_prefix for t in targets({"a.yaml": deep, "b.yaml": good})] == ["http://127.0.0.1:8888/"]
