"""A tiny HTTP endpoint per service process: `/healthz` (JSON, 200 or 503) and `/metrics` (Prometheus)."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve(port: int, registry: CollectorRegistry, health: Callable[[], tuple[bool, dict]],
          host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve in a daemon thread; `health()` returns (healthy, details). Port 0 picks a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith("/metrics"):
                body, code, kind = generate_latest(registry), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/healthz"):
                ok, details = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **details}).encode()
                code, kind = (200 if ok else 503), "application/json"
            else:
                body, code, kind = b"not found\n", 404, "text/plain"
            try:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the prober gave up (its timeout); it asks again

        def log_message(self, *args) -> None:
            pass  # structured logs only

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
