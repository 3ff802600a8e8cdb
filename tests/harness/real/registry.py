"""A local image and chart registry for the real-cluster tests: how a user's nodes get the agent's image and chart.

Debian's `docker-registry` (distribution 2.8; `make real-k8s` installs it with apache2-utils' `htpasswd`) serving
HTTPS with a CA made here for each start (openssl, as the control plane's PKI is made), basic auth from an htpasswd
file (bcrypt, `htpasswd -B`: the only hash distribution accepts), its storage below the test root. It listens in a
network namespace the caller names by a command prefix (`net_prefix(pid)`: the namespace of a process, e.g. a
kubeadm node's init; a bridge's "switch" namespace for several nodes), so nothing of the machine's network changes;
the clients that push to it (`podman push`, `helm push`) run in that namespace too, with its CA and credentials.

A node's containerd trusts it through its registry hosts folder (`hosts_dir`: containerd's `config_path`, one
`<host:port>/hosts.toml` naming the CA); the credentials reach the node only the Kubernetes way, an
imagePullSecret (`docker_config_json`), which the kubelet hands to containerd with each pull.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.real.controlplane import EC_KEY, _openssl, die_with_parent, issue, terminate, wait_until

PORT = 5000
USER = "patcher-ci"
#: What the registry needs here, and the Debian package of each (tools/realk8s/runtime.py installs the first two;
#: curl, which asks it whether it answers, is the kubeadm node's too).
PROGRAMS = {"docker-registry": "docker-registry", "htpasswd": "apache2-utils", "curl": "curl"}
START_DEADLINE = 60.0


def registry_missing() -> str | None:
    """One line on why the registry cannot start here, or None."""
    missing = sorted({pkg for program, pkg in PROGRAMS.items() if shutil.which(program) is None})
    if missing:
        return f"no {', '.join(missing)}: `make real-k8s` installs them (Debian, as root)"
    return None


def net_prefix(pid: int) -> list[str]:
    """The command prefix that runs a program in the network namespace of process `pid` (and nothing else of it:
    the program keeps this machine's files, e.g. podman's image store)."""
    return ["nsenter", f"--target={pid}", "--net", "--"]


@dataclass
class Registry:
    """A registry on `address`:`port` in the network namespace `netns` runs commands in, its files below `root`."""

    root: Path
    address: str
    netns: Sequence[str]
    port: int = PORT
    user: str = USER
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    #: seconds from `start` to the first authenticated answer on /v2/
    started_in: float = 0.0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """The registry's name in image references and OCI URLs: `address:port`."""
        return f"{self.address}:{self.port}"

    @property
    def ca(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def cert_dir(self) -> Path:
        """What `podman push --cert-dir` reads: every `*.crt` in it is a CA."""
        return self.root / "certs.d"

    def log(self, lines: int = 40) -> str:
        path = self.root / "registry.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    # -- start ------------------------------------------------------------------------------------------------

    def prepare(self) -> Registry:
        """The CA and the serving certificate, the htpasswd file and the configuration: all a node needs to trust
        the registry (`hosts_dir`) exists before the registry runs, so a node can be started first."""
        pki = self.root / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj",
                 "/CN=realk8s-registry-ca", cwd=pki)
        crt, key = issue(pki, "registry", f"/CN={self.address}", server_names=(self.address,))
        self.cert_dir.mkdir(exist_ok=True)
        shutil.copyfile(self.ca, self.cert_dir / "ca.crt")
        htpasswd = self.root / "htpasswd"
        proc = subprocess.run(["htpasswd", "-B", "-b", "-c", str(htpasswd), self.user, self.password],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, f"htpasswd: {proc.stderr}"
        (self.root / "storage").mkdir(exist_ok=True)
        # distribution's configuration is YAML; JSON is YAML
        (self.root / "config.yml").write_text(json.dumps({
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "storage")}},
            "http": {"addr": self.host, "secret": secrets.token_hex(16),
                     "tls": {"certificate": str(crt), "key": str(key)}},
            "auth": {"htpasswd": {"realm": "realk8s-registry", "path": str(htpasswd)}},
        }, indent=1))
        return self

    def start(self) -> Registry:
        started = time.monotonic()
        with (self.root / "registry.log").open("ab") as log:
            self.proc = subprocess.Popen([*self.netns, "docker-registry", "serve", str(self.root / "config.yml")],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}:\n{self.log()}")
            return self.status("/v2/", auth=True) == 200

        wait_until(answers, START_DEADLINE, lambda: f"the registry answering on {self.host}\n{self.log()}")
        assert self.status("/v2/", auth=False) == 401, "the registry answers without credentials"
        self.started_in = time.monotonic() - started
        return self

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None

    # -- clients ----------------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float = 300, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`argv` in the registry's network namespace (where its address is reachable)."""
        return subprocess.run([*self.netns, *argv], capture_output=True, text=True, timeout=timeout, check=False,
                              env=env, input=stdin)

    def status(self, path: str, *, auth: bool) -> int:
        """The HTTP status of a GET of `path` (0: no answer), the CA verified."""
        creds = ["--user", f"{self.user}:{self.password}"] if auth else []
        proc = self.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--cacert",
                         str(self.ca), *creds, f"https://{self.host}{path}"], timeout=30)
        return int(proc.stdout or 0) if proc.stdout.isdigit() else 0

    def push_image(self, local: str, repository: str, tag: str) -> str:
        """`podman push` of podman's image `local` as `<host>/<repository>:<tag>`; returns that reference."""
        ref = f"{self.host}/{repository}:{tag}"
        proc = self.run(["podman", "push", "--cert-dir", str(self.cert_dir), "--creds",
                         f"{self.user}:{self.password}", local, f"docker://{ref}"], timeout=600)
        assert proc.returncode == 0, f"podman push {ref}: {proc.stderr[-3000:]}"
        return ref

    def helm_env(self) -> dict[str, str]:
        """helm's own folders below the registry's root: its login is written there, not into ~/.config."""
        home = self.root / "helm"
        return {**os.environ, "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
                "HELM_DATA_HOME": str(home / "data"),
                "HELM_REGISTRY_CONFIG": str(home / "config" / "registry" / "config.json")}

    def helm(self, helm: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`helm args...` in the registry's network namespace, with `helm_env`."""
        return self.run([helm, *args], timeout=timeout, env=self.helm_env())

    def push_chart(self, helm: str, chart: Path, folder: str = "charts") -> str:
        """`helm package` of `chart`, `helm registry login` (the CA, the password on stdin), `helm push` to
        `oci://<host>/<folder>`; returns the chart's OCI reference (`oci://<host>/<folder>/<name>`)."""
        packed = self.root / "packages"
        packed.mkdir(exist_ok=True)
        proc = self.helm(helm, "package", str(chart), "--destination", str(packed))
        assert proc.returncode == 0, f"helm package: {proc.stderr}"
        (archive,) = packed.glob(f"{chart.name}-*.tgz")
        login = self.run([helm, "registry", "login", self.host, "--ca-file", str(self.ca), "--username", self.user,
                          "--password-stdin"], env=self.helm_env(), stdin=self.password, timeout=120)
        assert login.returncode == 0, f"helm registry login: {login.stderr}"
        proc = self.helm(helm, "push", str(archive), f"oci://{self.host}/{folder}", "--ca-file", str(self.ca))
        assert proc.returncode == 0, f"helm push: {proc.stderr}"
        return f"oci://{self.host}/{folder}/{chart.name}"

    # -- what a node needs ------------------------------------------------------------------------------------

    def hosts_dir(self, folder: Path) -> Path:
        """containerd's registry hosts folder (the CRI plugin's `registry.config_path`) for this registry: HTTPS
        with its CA, pull and resolve. No credentials: those come with each pull, from the pod's imagePullSecret."""
        host = folder / self.host
        host.mkdir(parents=True, exist_ok=True)
        (host / "hosts.toml").write_text(
            f'server = "https://{self.host}"\n\n[host."https://{self.host}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  ca = "{self.ca}"\n')
        return folder

    def docker_config_json(self) -> str:
        """The `.dockerconfigjson` of a kubernetes.io/dockerconfigjson Secret that logs the kubelet in here."""
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"username": self.user, "password": self.password, "auth": auth}}})


@contextmanager
def serving(made: Registry) -> Iterator[Registry]:
    """`made` (prepared) started, and stopped on exit whatever the body raised. Its `netns` may be set after
    `prepare`: a node that trusts the registry is started first, then the registry in that node's network."""
    try:
        yield made.start()
    finally:
        made.stop()
