"""The HTTP side of `humanset browse`: a routing table over the run's catalog, its images and the
labels file, served by the standard library's ThreadingHTTPServer (one thread a request).

What it answers, and nothing else (every other path is 404):

    GET  /                      the app (static/index.html); /static/app.js, /static/app.css
    GET  /api/summary           run, thresholds, the grid's choices, labels state (no catalog scan)
    GET  /api/funnel            totals, funnel, reject reasons (a few scans, cached)
    GET  /api/samples?FILTER    one page of the grid (FILTER: explore/browse/queries.py)
    GET  /api/count?FILTER      rows matching the filter (cached per filter)
    GET  /api/sample/ID         one sample: row, persons, text boxes, source, duplicate cluster, labels
    GET  /img/s/ID, /img/l/ID   a thumbnail / the sample page's image (JPEG), or a placeholder (SVG)
    POST /api/label             {"sample_id", "stage", "value": 0|1|null} -> the labels CSV

Safe by default: static files come from a fixed table of names, a sample id only ever reaches DuckDB
as a bound parameter (an unknown one is 404), images are decoded and re-encoded (never raw bytes of a
file a row names), nothing is written but the labels file (outside RUN). Bound to loopback, requests
whose Host is not this server are refused (DNS rebinding), and a label is accepted only as JSON from
this origin (no cross-site form can post one). An error is a one-line JSON message, never a traceback.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qsl, urlsplit

import duckdb

from explore.browse.labels import LabelError, Labels
from explore.browse.filters import BadRequest
from explore.browse.queries import SAMPLE_ID, RunCatalog
from explore.browse.thumbnails import SIZES, SampleBytes, Thumbnails

log = logging.getLogger(__name__)

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
MAX_BODY = 4096
_IMG = re.compile(r"^/img/([a-z])/([^/]+)$")
_SAMPLE = re.compile(r"^/api/sample/([^/]+)$")


@dataclass
class Response:
    status: int
    body: bytes = b""
    type: str = "application/json"
    headers: dict = field(default_factory=dict)


def json_response(obj, status: int = 200) -> Response:
    return Response(status, json.dumps(obj, allow_nan=False, default=str).encode(),
                    headers={"Cache-Control": "no-store"})


def error(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def static_files() -> dict[str, bytes]:
    folder = resources.files("explore.browse") / "static"
    return {name: (folder / name).read_bytes() for name in STATIC}


class BrowseApp:
    """The routes, independent of sockets: handle(method, path, headers, body) -> Response."""

    def __init__(self, run, labels_path=None):
        self.catalog = RunCatalog(run)
        try:
            self.labels = Labels(labels_path)
        except BaseException:
            self.catalog.close()
            raise
        self.images = Thumbnails(SampleBytes(self.catalog.run, self.catalog.curated_member))
        self.static = static_files()

    def close(self) -> None:
        self.catalog.close()

    def handle(self, method: str, target: str, body: bytes = b"") -> Response:
        url = urlsplit(target)
        path = url.path
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        try:
            if method == "POST":
                return self._label(body) if path == "/api/label" else error(404, "not found")
            if method not in ("GET", "HEAD"):
                return error(405, f"{method}: not allowed")
            return self._get(path, params)
        except BadRequest as e:
            return error(400, str(e))
        except duckdb.Error as e:  # a damaged catalog part, a store that stopped answering
            log.warning("browse: %s: %s", path, str(e).splitlines()[0])
            return error(500, f"catalog: {str(e).splitlines()[0]}")
        except Exception as e:  # never a traceback to the page
            log.warning("browse: %s: %s: %s", path, type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
            return error(500, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    def _get(self, path: str, params: dict) -> Response:
        if path in ("/", "/index.html"):
            return self._static("index.html")
        if path.startswith("/static/"):
            return self._static(path[len("/static/"):])
        if path == "/api/summary":
            return json_response({**self.catalog.summary(), "labels": self.labels.summary()})
        if path == "/api/funnel":
            return json_response(self.catalog.funnel())
        if path == "/api/samples":
            page = self.catalog.page(params)
            for r in page["rows"]:
                r["labels"] = self.labels.of(r["sample_id"])
            return json_response(page)
        if path == "/api/count":
            return json_response({"count": self.catalog.count(params)})
        m = _SAMPLE.match(path)
        if m:
            sample = self.catalog.sample(m[1], params.get("shard") or None) if SAMPLE_ID.match(m[1]) else None
            if sample is None:
                return error(404, f"no sample {m[1][:128]!r} in this run")
            sample["labels"] = self.labels.of(m[1])
            return json_response(sample)
        m = _IMG.match(path)
        if m and m[1] in SIZES:
            return self._image(m[2], m[1], params.get("shard") or None)
        return error(404, "not found")

    def _static(self, name: str) -> Response:
        if name not in self.static:  # a fixed table: no name from the request reaches the file system
            return error(404, "not found")
        cache = "no-cache" if name == "index.html" else "max-age=300"
        return Response(200, self.static[name], STATIC[name], {"Cache-Control": cache})

    def _image(self, sample_id: str, size: str, shard: str | None) -> Response:
        if not SAMPLE_ID.match(sample_id):
            return error(404, "not found")
        got = self.images.get(sample_id, size, lambda sid: self.catalog.image_row(sid, shard))
        if got is None:
            return error(404, f"no sample {sample_id!r} in this run")
        headers = {"Cache-Control": "private, max-age=3600"}
        if got["reason"]:
            headers["X-Humanset-Unreadable"] = got["reason"].encode("ascii", "replace").decode()[:300]
            headers["Cache-Control"] = "no-cache"
        if got["decoded"]:
            headers["X-Humanset-Decoded"] = f"{got['decoded'][0]}x{got['decoded'][1]}"
        return Response(200, got["body"], got["type"], headers)

    def _label(self, body: bytes) -> Response:
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return error(400, "a label is a JSON object {sample_id, stage, value}")
        if not isinstance(req, dict):
            return error(400, "a label is a JSON object {sample_id, stage, value}")
        sid, stage, value = req.get("sample_id"), req.get("stage"), req.get("value")
        if not isinstance(sid, str) or not SAMPLE_ID.match(sid) or self.catalog.image_row(sid) is None:
            return error(404, f"no sample {str(sid)[:128]!r} in this run")
        try:
            labels = self.labels.set(sid, stage, value)
        except LabelError as e:
            return error(409 if not self.labels.enabled else 400, str(e))
        return json_response({"sample_id": sid, "labels": labels, "summary": self.labels.summary()})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a page's 60 thumbnails reuse a few connections
    server_version = "humanset-browse"
    sys_version = ""
    app: BrowseApp  # set on the subclass made by make_server
    allowed_hosts: frozenset | None  # Host headers accepted (None: any, when bound beyond loopback)

    def _refuse(self) -> Response | None:
        host = (self.headers.get("Host") or "").lower()
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            return error(403, f"Host {host[:100]!r} is not this server")
        if self.command == "POST":
            origin = self.headers.get("Origin")
            if origin is not None and urlsplit(origin).netloc.lower() != host:
                return error(403, "a label must come from this app's own page")
            if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
                return error(415, "a label is posted as application/json")
        return None

    def _serve(self, body: bytes = b"") -> None:
        resp = self._refuse() or self.app.handle(self.command, self.path, body)
        self.send_response(resp.status)
        for k, v in {**SECURITY_HEADERS, "Content-Type": resp.type, "Content-Length": str(len(resp.body)),
                     **resp.headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)

    def do_GET(self):  # noqa: N802 (http.server's names)
        self._serve()

    def do_HEAD(self):  # noqa: N802
        self._serve()

    def do_POST(self):  # noqa: N802
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_BODY:
            self.close_connection = True
            resp = error(413, f"a label body is at most {MAX_BODY} bytes")
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.type)
            self.send_header("Content-Length", str(len(resp.body)))
            self.end_headers()
            self.wfile.write(resp.body)
            return
        self._serve(self.rfile.read(n))

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature): per-request lines stay out
        log.debug("browse: " + format, *args)


class BrowseServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(app: BrowseApp, host: str = "127.0.0.1", port: int = 0) -> BrowseServer:
    """A server for `app` bound to host:port (0: a free port); serve_forever() it, or start()."""
    handler = type("BoundHandler", (Handler,), {"app": app, "allowed_hosts": None})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # --host ::1 binds an IPv6 socket
    server = type("Server", (BrowseServer,), {"address_family": family})((host, port), handler)
    real_port = server.server_address[1]
    if is_loopback(host):
        handler.allowed_hosts = frozenset(f"{h}:{real_port}" for h in ("127.0.0.1", "localhost", "[::1]", host))
    return server


def start(app: BrowseApp, host: str = "127.0.0.1", port: int = 0) -> tuple[BrowseServer, str]:
    """The server running in a background thread, and its URL (tests, bench)."""
    server = make_server(app, host, port)
    threading.Thread(target=server.serve_forever, name="humanset-browse", daemon=True).start()
    return server, url_of(server)


def url_of(server: BrowseServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
