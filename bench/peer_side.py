"""The peer's side of ``bench/peer.py``, run by the peer's own interpreter (its venv, its pinned requirements).

Standard library and the peer's ``main.py`` only: nothing of ``patcher`` is imported here. The peer's code runs
unchanged; two things its ``run()`` hard-codes are pointed elsewhere from outside, the way a test harness
would: the manifest path (``/etc/kubernetes/manifests/kube-scheduler.yaml``, taken by ``ManifestFile``) and the
in-cluster credentials (its ``load_incluster_config()`` reads ``/var/run/secrets/...``; here the same official
loader reads a token and CA given on the command line).

Modes:

* ``worker PEER_DIR``: one JSON request a line on stdin (``{"manifest": path, "n": repeats, "tmp": folder,
  "config": file, "fresh_config": bool}``), one JSON answer a line: per repeat, the time of the peer's loop
  body on the unpatched manifest (its five ``copy_not_equal``, which copy only when ``fresh_config`` removed
  the targets first, ``load``, ``patch``, ``backup``, ``remove``, ``flush``) and of its ``restore`` (a
  ``shutil.copy`` of its backup);
* ``run PEER_DIR MANIFEST TOKEN CA -- ARGS``: the peer's ``run()`` with ARGS as its command line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

CONFIG_NAMES = ("config", "policy", "config-19", "config-23", "config-29")


def _import_peer(peer_dir: str) -> Any:
    sys.path.insert(0, peer_dir)
    import main as peer  # type: ignore[import-not-found]

    return peer


class Site:
    """A node folder for the peer: its five source files, their targets already in place, a backup folder."""

    def __init__(self, peer: Any, tmp: Path, config_text: bytes) -> None:
        self.peer = peer
        for sub in ("src", "targets", "backup", "manifests"):
            (tmp / sub).mkdir(parents=True, exist_ok=True)
        self.sources = [peer.File(str(tmp / "src" / name)) for name in CONFIG_NAMES]
        self.targets = [peer.File(str(tmp / "targets" / name)) for name in CONFIG_NAMES]
        for f in self.sources + self.targets:
            Path(f.path).write_bytes(config_text)
        volumes = []
        for name, target in zip(CONFIG_NAMES, self.targets, strict=True):
            volume = peer.Volume(f"scheduler-{name}", target.path)
            volume.compile_config()
            volumes.append(volume)
        self.path = tmp / "manifests" / "kube-scheduler.yaml"
        # As run() builds it for Kubernetes >= 1.29: the 1.29 config, --pod-max-in-unschedulable-pods-duration.
        self.manifest = peer.ManifestFile(str(self.path), volumes, self.targets[4].path, str(tmp / "backup"), True)

    def patch(self) -> None:
        """The body of the peer's loop for a manifest that needs the patch (its sleep left out)."""
        peer, m = self.peer, self.manifest
        peer._must_exist(m, self.sources[0], self.sources[1], self.sources[2])
        for src, dst in zip(self.sources, self.targets, strict=True):
            peer.copy_not_equal(src, dst)
        m.load()
        m.patch()
        if m.changed:
            m.backup()
            m.remove()
            m.flush()

    def restore(self) -> None:
        self.manifest.restore()


def worker(peer_dir: str) -> None:
    peer = _import_peer(peer_dir)
    sites: dict[str, Site] = {}
    for line in sys.stdin:
        req = json.loads(line)
        tmp = req["tmp"]
        site = sites.get(tmp) or sites.setdefault(tmp, Site(peer, Path(tmp), Path(req["config"]).read_bytes()))
        data = Path(req["manifest"]).read_bytes()
        patch: list[float] = []
        restore: list[float] = []
        try:
            for _ in range(req["n"]):
                site.path.write_bytes(data)
                if req.get("fresh_config"):  # its five config files not in place: copy_not_equal copies them
                    for target in site.targets:
                        Path(target.path).unlink(missing_ok=True)
                t0 = time.perf_counter()
                site.patch()
                t1 = time.perf_counter()
                site.restore()
                t2 = time.perf_counter()
                if site.path.read_bytes() != data:
                    raise AssertionError("restore(patch(m)) != m")
                patch.append((t1 - t0) * 1000)
                restore.append((t2 - t1) * 1000)
            answer: dict[str, Any] = {"patch": patch, "restore": restore}
        except Exception as exc:  # the peer refuses or breaks on this manifest: it is left out of both sides
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


def run(peer_dir: str, manifest: str, token: str, ca: str, args: list[str]) -> None:
    peer = _import_peer(peer_dir)
    from kubernetes.config import incluster_config  # the peer's own pinned client

    def load_incluster_config() -> None:
        loader = incluster_config.InClusterConfigLoader(token_filename=token, cert_filename=ca)  # type: ignore[no-untyped-call]
        loader.load_and_set()  # type: ignore[no-untyped-call]

    peer.config.load_incluster_config = load_incluster_config
    init = peer.ManifestFile.__init__

    def manifest_file(self: Any, path: str, *rest: Any) -> None:
        init(self, manifest, *rest)

    peer.ManifestFile.__init__ = manifest_file
    sys.argv = ["main.py", *args]
    peer.run()


def main() -> None:
    mode = sys.argv[1]
    if mode == "worker":
        worker(sys.argv[2])
    elif mode == "import":
        t0 = time.perf_counter()
        _import_peer(sys.argv[2])
        print(json.dumps({"import_ms": (time.perf_counter() - t0) * 1000}))
    else:
        peer_dir, manifest, token, ca = sys.argv[2:6]
        rest = sys.argv[6:]
        run(peer_dir, manifest, token, ca, rest[1:] if rest[:1] == ["--"] else rest)


if __name__ == "__main__":
    main()
