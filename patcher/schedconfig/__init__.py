"""Scheduler configuration: from the source folder (a ConfigMap mount) to the files the scheduler reads.

This is the seam between the manifest engine and the configuration logic: the engine hands over what it
learned from the manifest (image, flags, a foreign ``--config``) and gets back the exact bytes to place in the
host config folder. Everything here is pure except reading the source folder.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from patcher.errors import ConfigError

CONFIG_GROUP = "kubescheduler.config.k8s.io"


@dataclass(frozen=True)
class ForeignConfig:
    """A ``--config`` that the manifest already carried and that we did not add."""

    container_path: str  # the flag value, a path inside the scheduler container
    node_path: str | None = None  # the same file on the node, mapped through hostPath volumes
    text: str | None = None  # its content, read by the engine under the host root


@dataclass(frozen=True)
class ConfigRequest:
    source_dir: Path  # the ConfigMap mount, local to the agent
    host_config_dir: str  # node path that the scheduler container sees at the same path
    image: str | None = None  # kube-scheduler image from the manifest (version detection)
    kube_version: str | None = None  # explicit override (--kube-version)
    fallback_version: str | None = None  # e.g. the API server's /version, when the image says nothing
    scheduler_flags: tuple[str, ...] = ()  # the scheduler's flags as written in the manifest
    foreign: ForeignConfig | None = None  # set in merge mode only


@dataclass(frozen=True)
class RenderedConfig:
    files: dict[str, bytes]  # file name in the host config folder -> exact content
    main: str  # the file that --config points at
    config_hash: str  # sha256 hex of the main file (which names every other file by its hash)
    form: str  # which source form was used
    api_version: str
    notes: tuple[str, ...] = field(default=())

    @property
    def short_hash(self) -> str:
        return self.config_hash[:12]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_config(req: ConfigRequest) -> RenderedConfig:
    """Read the source folder and produce the host files for this node's scheduler."""
    path = req.source_dir / "config.yaml"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), "source config not found") from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read source config: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
        data = YAML(typ="safe", pure=True).load(text)
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8") from None
    except YAMLError as exc:
        raise ConfigError(str(path), f"invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("kind") != "KubeSchedulerConfiguration":
        raise ConfigError(str(path), "not a KubeSchedulerConfiguration (kind must be KubeSchedulerConfiguration)")
    api = str(data.get("apiVersion", ""))
    if not api.startswith(CONFIG_GROUP + "/"):
        raise ConfigError(str(path), f"apiVersion {api!r} is not in the {CONFIG_GROUP} group")
    digest = sha256_hex(raw)
    name = f"config-{digest[:12]}.yaml"
    return RenderedConfig(files={name: raw}, main=name, config_hash=digest, form="config.yaml", api_version=api)
