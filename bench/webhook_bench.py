"""What the admission webhook adds to a pod's creation, measured on its real HTTPS server.

The API server calls the webhook once per pod CREATE in a selected namespace, over connections it keeps open;
a controller creating pods in bulk calls it from several connections at once. Measured here, with a CA and
certificate made by the openssl CLI (tests/harness/emu/extservers.Pki) and the rules of the default selection:

* a review on a kept-open connection, ``--clients`` connections at once (the steady case), per review and
  reviews per second over all of them;
* a review on a new connection (TCP + TLS handshake + review: the API server's first call, or after an idle
  connection was closed);
* the rules alone (``review_patch`` + ``review_response`` + JSON), without the server: the floor.

Figures go to the one table (``bench/table.py``) through ``$BENCH_ROWS``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows as bench_rows  # noqa: E402
from bench.rows import stats, timed  # noqa: E402
from patcher.adapters.httpserver import CertReloader, HttpServer  # noqa: E402
from patcher.core.admission import Selection  # noqa: E402
from patcher.services.webhook import MUTATE_PATH, AdmissionWebhook  # noqa: E402
from tests.deploy.test_webhook_rules import review  # noqa: E402
from tests.harness.admission_samples import NOT_READY, configmap, new_pod  # noqa: E402
from tests.harness.emu.extservers import Pki  # noqa: E402


def post(conn: http.client.HTTPSConnection, body: bytes) -> None:
    conn.request("POST", MUTATE_PATH, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    assert resp.status == 200 and answer["response"]["allowed"] is True and "patch" in answer["response"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=500, help="reviews per client on kept-open connections")
    parser.add_argument("--clients", type=int, default=8, help="connections at once")
    parser.add_argument("--cold", type=int, default=100, help="reviews on a new connection each")
    args = parser.parse_args()
    body = json.dumps(review(new_pod())).encode()
    webhook = AdmissionWebhook(Selection(), lambda: (True, configmap(NOT_READY)))
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki.make(Path(tmp) / "pki")
        ctx = ssl.create_default_context(cafile=str(pki.path("ca.crt")))
        server = HttpServer(webhook.handle, "127.0.0.1:0", keep_alive=True,
                            certs=CertReloader(str(pki.path("server.crt")), str(pki.path("server.key"))))
        server.start()
        try:
            warm: list[list[float]] = [[] for _ in range(args.clients)]

            def client(i: int) -> None:
                conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
                post(conn, body)  # the handshake, not measured here
                warm[i] = [timed(lambda: post(conn, body)) for _ in range(args.n)]
                conn.close()

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            kept = [v for values in warm for v in values]

            def cold_review() -> None:
                conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
                post(conn, body)
                conn.close()

            cold = [timed(cold_review) for _ in range(args.cold)]
        finally:
            server.stop()
    floor = [timed(lambda: webhook.handle("POST", MUTATE_PATH, body)) for _ in range(args.n)]
    figures = [
        (f"webhook review, kept-open connection ({args.clients} at once)", kept),
        ("webhook review, new TLS connection", cold),
        ("webhook rules alone (no server)", floor),
    ]
    print(f"{'figure':<52} {'n':>6} {'median ms':>10} {'p99 ms':>9}")
    for figure, values in figures:
        median, p99 = stats(values)
        bench_rows.record(bench_rows.Row(figure, len(values), median, p99))
        print(f"{figure:<52} {len(values):>6} {median:>10.3f} {p99:>9.3f}")
    print(f"{len(kept) / wall:.0f} reviews/s over {args.clients} kept-open connections "
          f"(2-core machine shared with the clients)")


if __name__ == "__main__":
    main()
