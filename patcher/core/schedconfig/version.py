"""Which kube-scheduler runs on this node: the rendered apiVersion depends on its minor, and a wrong guess makes it
exit. The most direct evidence first: ``--kube-version`` (the operator knows best), the manifest's image tag (what
the kubelet runs), then the API server's ``/version`` (the scheduler may lag during an upgrade); else refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patcher.core.errors import ConfigError

#: The supported kube-scheduler minors, both ends inclusive: the one statement the README ("Supported Kubernetes
#: versions"), the chart's ``kubeVersion`` and the ``--kube-version`` check follow (tests/deploy/test_supported.py
#: checks they agree). The newest end is the newest release whose real binaries the tests run
#: (``tools/realk8s/v1.37.*``: the config oracle, the real API server and scheduler, the real kubelet); the
#: oldest is the oldest minor whose config types are generated from its release branch
#: (``schemas/kube-scheduler-1.19.json``), the first with scheduling profiles (``v1beta1``).
SUPPORTED_MINORS: tuple[tuple[int, int], tuple[int, int]] = ((1, 19), (1, 37))
SUPPORTED_TEXT = "supported: {}.{} to {}.{}".format(*SUPPORTED_MINORS[0], *SUPPORTED_MINORS[1])

_VERSION = re.compile(r"v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?(?P<rest>[-+_.~].*)?")
_FIX_HINT = "pass --kube-version (e.g. --kube-version=1.29)"


@dataclass(frozen=True)
class Launch:
    """What the scheduler's manifest adds to its config at start-up, so that the config is judged as it will
    run: the ``--leader-elect*`` flags as written, and whether the image is upstream's kube-scheduler (only the
    in-tree plugin registry)."""

    leader_election: tuple[tuple[str, str | None], ...] = ()
    upstream_image: bool = False
    gates_off: frozenset[str] = frozenset()  # gates the manifest's --feature-gates sets to false


@dataclass(frozen=True)
class KubeVersion:
    """A Kubernetes version as far as rendering cares: major, minor, and the optional patch for messages."""

    major: int
    minor: int
    patch: int | None = None
    source: str = ""  # where it came from, for notes: "--kube-version", "image tag", "API server"
    # gates switched on by the manifest's --feature-gates: some upstream rules depend on them
    feature_gates: frozenset[str] = frozenset()
    launch: Launch | None = None  # None: not known (no manifest), nothing is assumed about flags or image

    @property
    def key(self) -> tuple[int, int]:
        """What the version table is keyed on; patch releases never change the served APIs."""
        return (self.major, self.minor)

    @property
    def short(self) -> str:
        """``1.29``: used in headers so that a patch upgrade does not change the rendered bytes."""
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return self.short if self.patch is None else f"{self.major}.{self.minor}.{self.patch}"


def parse_version(text: str, *, source: str = "") -> KubeVersion | None:
    """Parse ``1.29``, ``v1.29.3``, ``v1.30.2-rke2r1-build20240717``, ``v1.10.4_coreos.0``; None if it is not a
    Kubernetes 1.x version (scheduler-plugins images are tagged ``v0.<k8s minor>.<patch>``: guessing the mapping
    would be wrong for any other image that happens to use semver tags)."""
    match = _VERSION.fullmatch(text.strip())
    if match is None or int(match.group("major")) != 1:
        return None
    patch = match.group("patch")
    return KubeVersion(
        major=int(match.group("major")),
        minor=int(match.group("minor")),
        patch=int(patch) if patch is not None else None,
        source=source,
    )


def version_from_image(image: str) -> KubeVersion | None:
    """The Kubernetes version that an image's tag names (``…/kube-scheduler:v1.28.0@sha256:…`` → 1.28.0), or None
    when it has no tag or the tag is not a Kubernetes 1.x version."""
    last = image.strip().split("@", 1)[0].rsplit("/", 1)[-1]  # a ':' before the last '/' is a registry port
    tag = last.partition(":")[2]  # no tag: "", which is no version
    return parse_version(tag, source=f"image tag {tag}")


def _not_a_version(text: str) -> str:
    """The one wording for a ``--kube-version`` that is no version, from the CLI's check or ``resolve_version``."""
    return f"not a Kubernetes version: {text!r} (expected e.g. 1.34 or v1.34.2)"


def _outside(version: KubeVersion) -> str:
    """The one wording for a version outside ``SUPPORTED_MINORS``, from the CLI's check or ``resolve_version``
    (which names where the version came from)."""
    shown = f"kube-scheduler {version}" + (f" ({version.source})" if version.source else "")
    age = "too old" if version.key < SUPPORTED_MINORS[0] else "too new"
    return f"{shown} is {age}: outside the supported range ({SUPPORTED_TEXT})"


def supported_version(text: str) -> str:
    """``text`` when it is a Kubernetes version inside ``SUPPORTED_MINORS``; else ``ValueError`` saying why
    (the ``--kube-version`` check: an operator's claim outside the tested range is refused, not rendered)."""
    version = parse_version(text)  # no source: argparse already names --kube-version
    if version is None:
        raise ValueError(_not_a_version(text))
    first, last = SUPPORTED_MINORS
    if not first <= version.key <= last:
        raise ValueError(_outside(version))
    return text


def resolve_version(
    image: str | None, override: str | None, fallback: str | None, *, where: str | None = None
) -> KubeVersion:
    """The scheduler version: ``--kube-version``, else the image tag, else the API server's; ``where`` (the manifest)
    is named in errors about the image. Older than the supported range is refused, whatever says so (a newer one
    is judged with the newest types)."""
    if override:
        version = parse_version(override, source="--kube-version")
        if version is None:
            raise ConfigError(None, f"--kube-version: {_not_a_version(override)}")
    else:
        version = version_from_image(image) if image else None
        if version is None and fallback:
            version = parse_version(fallback, source="API server /version")
    if version is None:
        seen = f"image {image!r} has no Kubernetes version tag" if image else "no scheduler image is known"
        if fallback:
            seen += f", API server version {fallback!r} is not a Kubernetes version"
        raise ConfigError(where, f"cannot tell the kube-scheduler version: {seen}; {_FIX_HINT}")
    if version.key < SUPPORTED_MINORS[0]:
        raise ConfigError(where, _outside(version))
    return version
