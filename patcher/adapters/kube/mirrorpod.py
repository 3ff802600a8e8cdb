"""Watch one mirror pod (``<static pod name>-<node name>``) and keep its latest state at hand.

The kubelet publishes a static pod's status through its mirror pod; the agent reads the scheduler's restart
from it. Only that one pod is watched (``listwatch.named``), so the agent needs no right to list a namespace's
pods and the API server sends it nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from patcher.adapters.kube.backoff import Backoff
from patcher.adapters.kube.listwatch import NamedListWatcher, run_hook
from patcher.adapters.kube.transport import PODS, Api

log = logging.getLogger(__name__)

Pod = dict[str, Any]
UpdateHook = Callable[[Pod | None], None]


class MirrorPodWatcher(NamedListWatcher):
    """A ``ListWatcher`` of one pod by name that keeps ``latest`` (and ``on_update``) fed with its latest state
    (``None`` once it is deleted). A restart verdict of "not yet" from a view that is not ``fresh`` says nothing
    about the scheduler: it must not decide a rollback on its own."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        pod_name: str,
        *,
        on_update: UpdateHook | None = None,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 240,
        min_healthy_s: float = 1.0,
    ) -> None:
        self.pod_name = pod_name
        super().__init__(
            api, PODS, namespace, pod_name, label=f"mirror-pod-{pod_name}",
            on_change=lambda: run_hook(log, on_update, "mirror pod update", self.latest()),
            backoff=backoff, watch_timeout_s=watch_timeout_s, failure_level=logging.WARNING,
            min_healthy_s=min_healthy_s,
        )

    def __enter__(self) -> MirrorPodWatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def latest(self) -> Pod | None:
        """The latest pod seen (the dict the watch stored: read-only), ``None`` when it does not exist or has not
        been read yet."""
        return cast("Pod | None", self.state()[1])
