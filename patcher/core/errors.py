"""One error type for everything the agent refuses to do.

Every refusal must name the file and the problem, so an operator reading one log line knows where to look;
carrying both as fields (instead of a formatted string) lets the CLI, the logs and the Node annotation each
render them their own way.
"""

from __future__ import annotations


class PatcherError(Exception):
    """A refusal: bad input or an unsafe situation. Nothing on disk was changed when this is raised."""

    def __init__(self, path: str | None, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class ManifestError(PatcherError):
    """The kube-scheduler manifest cannot be patched or restored safely."""


class ConfigError(PatcherError):
    """The scheduler configuration (source or rendered) is invalid for the target scheduler."""


class StateFolderError(PatcherError):
    """The state folder (``--state-dir``: the record, the saved original, the writer lock) cannot be written
    or made. Apart from other refusals because the agent answers it differently: nothing may be written while
    the record of it cannot be, and the folder is tried again until it works (a read-only remount, a full
    disk, a folder replaced by a file are fixed from outside, without a restart)."""
