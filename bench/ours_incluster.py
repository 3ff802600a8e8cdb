"""Our side of ``bench/peer.py`` with the API, in-cluster like the DaemonSet and like the peer's side.

``scheduler-patcher run`` builds its client from the service account (``/var/run/secrets/...``) when no
kubeconfig is given; here the same official loader (``kube.client.load_configuration``, in-cluster branch)
reads the emulator's token and CA given on the command line, the way ``bench/peer_side.py`` points the peer's
``load_incluster_config()`` at them. Nothing else changes: the agent's own ``run`` with ARGS, its client built
in the background thread as usual. ``patcher.services.runner`` is imported here before the signal handlers
are in (``entry.main`` imports it right after them anyway, before the first patch).

Usage: ``python bench/ours_incluster.py TOKEN CA -- run ARGS`` with ``KUBERNETES_SERVICE_HOST``/``PORT`` set.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patcher.adapters.kube.transport import Api


def main() -> int:
    token, ca, *rest = sys.argv[1:]
    args = rest[1:] if rest[:1] == ["--"] else rest
    from patcher.commands import entry
    from patcher.core import settings
    from patcher.services import runner

    def incluster_client(given: settings.Api) -> Api:
        from patcher.adapters.kube.client import DEFAULT_TIMEOUT, ClientSettings, build_api_client

        assert given.kubeconfig is None, "in-cluster: no kubeconfig"
        # without HOME and KUBECONFIG: a ~/.kube/config on the bench machine would come first, as for kubectl
        environ = {k: v for k, v in os.environ.items() if k not in ("HOME", "KUBECONFIG")}
        return build_api_client(ClientSettings(token_file=token, ca_file=ca, timeout=given.timeout or DEFAULT_TIMEOUT),
                                environ)

    runner.api_client = incluster_client
    sys.argv = ["scheduler-patcher", *args]
    return entry.main()


if __name__ == "__main__":
    raise SystemExit(main())
