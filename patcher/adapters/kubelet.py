"""Whether this node's kubelet is up, from its local health endpoint (``healthzBindAddress``/``healthzPort``,
127.0.0.1:10248 on kubeadm and RKE2): a plain HTTP GET on the node's loopback, which the agent reaches through
hostNetwork. No API call and so no RBAC, and it answers while the API server is down.

A kubelet that is stopped, crash-looping under systemd or being restarted restarts no static pod: a manifest
written then waits for nobody, and a timeout then says nothing about the config (``lifecycle.observed``).

The check is armed only once the endpoint has answered once since the agent started (any HTTP status): the
agent is started by that kubelet, so an endpoint that never answered is one this agent cannot reach (a pod
without hostNetwork, another port, ``healthzPort: 0``), not a dead kubelet, and must not hold every write for
good. Every request has a short deadline: the loop never waits longer than ``TIMEOUT`` for it.
"""

from __future__ import annotations

import http.client
import logging
import urllib.parse

log = logging.getLogger(__name__)

#: Seconds one look at the endpoint may take (connect and answer); past it the kubelet counts as not healthy.
TIMEOUT = 1.0


class KubeletHealth:
    """``down()``: why the kubelet is known not healthy now, "" when it is healthy or cannot be known."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT, log_extra: dict[str, str] | None = None) -> None:
        """``url``: the endpoint (``http://127.0.0.1:10248/healthz``); empty: the check is off."""
        self.url, self.timeout, self._log_extra = url, timeout, log_extra or {}
        parts = urllib.parse.urlsplit(url)
        self._host, self._port = parts.hostname or "", parts.port or 80
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if url and (parts.scheme != "http" or not self._host):
            log.warning("--kubelet-healthz %s is not an http URL with a host: no kubelet check", url,
                        extra=self._log_extra)
            self._host = ""
        #: The endpoint answered once since the start: from then on a refusal is a kubelet that is down.
        self.armed = False
        self._said_unarmed = False

    @property
    def enabled(self) -> bool:
        return bool(self._host)

    def down(self) -> str:
        """One GET within ``timeout``: "" for a 200 (or the check off, or never armed), else what went wrong."""
        if not self.enabled:
            return ""
        status, why = self._get()
        if status is not None:
            if not self.armed:
                log.info("kubelet health endpoint %s answers: the agent holds writes while it is not healthy",
                         self.url, extra=self._log_extra)
            self.armed = True
            return "" if status == 200 else why
        if not self.armed:
            if not self._said_unarmed:
                self._said_unarmed = True
                log.warning("kubelet health endpoint %s does not answer (%s): no kubelet check until it does "
                            "(hostNetwork, the kubelet's healthzPort)", self.url, why, extra=self._log_extra)
            return ""
        return why

    def _get(self) -> tuple[int | None, str]:
        """(HTTP status, why it is not healthy); status None: no HTTP answer at all."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.request("GET", self._path)
            resp = conn.getresponse()
            body = resp.read(200).decode("utf-8", "replace").strip().replace("\n", " ")
            return resp.status, f"{self.url} answered {resp.status}{': ' + body if body else ''}"
        except TimeoutError:
            return None, f"{self.url} did not answer within {self.timeout:g}s"
        except ConnectionRefusedError:
            return None, f"{self.url} refused the connection"
        except (OSError, http.client.HTTPException) as exc:
            return None, f"{self.url}: {exc or type(exc).__name__}"
        finally:
            conn.close()
