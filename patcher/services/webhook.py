"""The admission webhook: AdmissionReview in, ``allowed: true`` and maybe the gate's JSON patch out, for clusters
without MutatingAdmissionPolicy (``gatekeeper --webhook-listen``): the policy's rules (``patcher.core.admission``)
with the verdict from the ConfigMap the policy's ``paramRef`` names.

Every answer allows the pod: a webhook fault must never block pod creation (``failurePolicy: Ignore`` covers a
webhook that does not answer; this covers one that answers). Until the ConfigMap is read the pod gets the gate
(fail safe): the replica answering is a gatekeeper, which releases it once its own verdict is Ready.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from patcher.core.admission import BadReview, Selection, review_patch, review_request, review_response
from patcher.core.kubeobj import Obj, dig

log = logging.getLogger(__name__)

#: Where the webhook configuration sends reviews (``clientConfig.service.path``).
MUTATE_PATH: Final = "/mutate"
#: The verdict while the ConfigMap has not been read yet: present without data, i.e. not Ready (gate).
UNKNOWN_PARAMS: Final[Obj] = {}


class AdmissionWebhook:
    """``handle(method, path, body)`` for ``HttpServer``; ``params()`` gives ``(known, ConfigMap or None)``."""

    def __init__(self, selection: Selection, params: Callable[[], tuple[bool, Obj | None]],
                 registry: CollectorRegistry | None = None) -> None:
        self.selection = selection
        self._params = params
        self._reviews = Counter("reviews", "AdmissionReviews answered, by result (gated, unchanged, error).",
                                ["result"], namespace="scheduler_patcher", subsystem="webhook",
                                registry=registry if registry is not None else CollectorRegistry())
        for result in ("gated", "unchanged", "error"):
            self._reviews.labels(result)

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, bytes, str]:
        if path.split("?", 1)[0] != MUTATE_PATH:
            return 404, b"not found\n", "text/plain"
        if method != "POST":
            return 405, b"POST an AdmissionReview\n", "text/plain"
        review: object = None
        patch = None
        try:
            review = json.loads(body)
            request = review_request(review)
            known, params = self._params()
            patch = review_patch(request, params if known else UNKNOWN_PARAMS, self.selection)
        except (ValueError, RecursionError, BadReview) as exc:  # not JSON (or nested past the parser's
            # recursion limit: a hostile body), not a review, a pod CREATE without a pod
            self._reviews.labels("error").inc()
            log.error("admission webhook: cannot read the AdmissionReview (%s); the pod is allowed unchanged", exc)
        else:
            self._reviews.labels("gated" if patch else "unchanged").inc()
            if patch:  # a ``metadata`` that is not an object is not ours to refuse: the pod is gated all the same
                meta = dig(request, "object", "metadata")
                log.debug("gate %s added to a new pod %s/%s", self.selection.gate, request.get("namespace"),
                          dig(meta, "name") or dig(meta, "generateName"))
        answer = review_response(review, patch)
        return 200, json.dumps(answer, separators=(",", ":")).encode(), "application/json"
