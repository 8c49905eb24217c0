"""A misbehaving object store for the tests and bench/store_faults.py: an HTTP proxy on 127.0.0.1 in
front of the SeaweedFS fixture (tests/s3server.py) that answers some requests the way a real store
does at a billion-image run's request rates.

Faults, each at a rate (a fraction of the requests it can apply to) drawn from one seeded generator,
so a seed gives one sequence of decisions (which request meets which fault also depends on the
order the clients' threads send them in):
- `slowdown`: any request is answered `503 SlowDown` (S3's XML error body; `Retry-After: N` when
  `retry_after` is set) and never reaches the store;
- `cut`: a GET with a body is forwarded, its headers sent with the full `Content-Length`, then the
  connection closed after part of the body;
- `reset`: the connection is reset (RST) before the request is forwarded;
- `lost_ack`: a write (PUT, POST, DELETE) is forwarded and applied, then answered
  `500 InternalError` (the store did it, the client does not know);
- `latency`: the request waits `latency_s` seconds (a range) before it is forwarded.

`once(method, path_part, fault)` aims a fault at the next matching request (before the random ones).
Request bodies are forwarded as they come (Content-Length or chunked, `Expect: 100-continue`
honoured), so streamed and multipart uploads pass. Signatures still verify: the client signs the
Host header, which is the proxy's, and the proxy forwards it unchanged. `counts` holds the requests
seen and the faults applied. Use it as a context manager, or `close()` it.
"""
from __future__ import annotations

import contextlib
import http.client
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler
from socketserver import ThreadingMixIn, TCPServer

WRITES = ("PUT", "POST", "DELETE")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
KINDS = ("slowdown", "cut", "reset", "lost_ack", "latency")


def s3_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>faultstore</RequestId></Error>").encode()


class _Server(ThreadingMixIn, TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class FaultStore:
    """The proxy: `FaultStore(target_endpoint, seed=1, slowdown=0.1, cut=0.05, lost_ack=0.05)`;
    point AWS_ENDPOINT_URL at `.endpoint`. Rates can be changed while it runs (`set(...)`)."""

    def __init__(self, target: str, seed: int = 0, slowdown: float = 0.0, cut: float = 0.0, reset: float = 0.0,
                 lost_ack: float = 0.0, latency: float = 0.0, latency_s: tuple[float, float] = (0.2, 1.0),
                 retry_after: int | None = None):
        host, port = target.rsplit("//", 1)[1].rsplit(":", 1)
        self.target = (host, int(port))
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.latency_s, self.retry_after = latency_s, retry_after
        self.rates = {}
        self.set(slowdown=slowdown, cut=cut, reset=reset, lost_ack=lost_ack, latency=latency)
        self._script: list[tuple[str, str, str]] = []
        self.log: list | None = None  # a list to record (method, path, fault) of each request in
        self.counts = {"requests": 0, "reads": 0, "writes": 0, **{k: 0 for k in KINDS}}
        store = self

        class Handler(_Handler):
            proxy = store

        self._srv = _Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._srv.server_address[1]}"
        self._thread = threading.Thread(target=self._srv.serve_forever, name="faultstore", daemon=True)
        self._thread.start()

    def set(self, **rates: float) -> None:
        for k, v in rates.items():
            if k not in KINDS or not 0 <= v <= 1:
                raise ValueError(f"fault {k}={v}: known faults are {', '.join(KINDS)}, each a rate in [0, 1]")
        with self._lock:
            self.rates.update(rates)

    def reseed(self, seed: int, **rates: float) -> None:
        """Start over: a new seed, new rates (the others kept), counts at zero (one proxy, many runs)."""
        self.set(**rates)
        with self._lock:
            self._rng = random.Random(seed)
            self._script.clear()
            self.counts = {k: 0 for k in self.counts}

    def once(self, method: str, path_part: str, fault: str, times: int = 1) -> None:
        """The next `times` requests of `method` whose path holds `path_part` meet `fault` (before the
        random ones): a test aims a fault at one request, e.g. once("PUT", "/.lock", "lost_ack")."""
        if fault not in KINDS:
            raise ValueError(f"fault {fault}: known faults are {', '.join(KINDS)}")
        with self._lock:
            self._script.extend([(method, path_part, fault)] * times)

    def decide(self, method: str, path: str = "") -> tuple[str | None, float, float]:
        """(the fault for this request or None, the fraction of a cut body sent, the latency in s)."""
        with self._lock:
            u, v, w, f = (self._rng.random() for _ in range(4))
            self.counts["requests"] += 1
            self.counts["writes" if method in WRITES else "reads"] += 1
            fault = None
            r = self.rates
            aimed = next((i for i, (m, part, _) in enumerate(self._script) if m == method and part in path), None)
            if aimed is not None:
                fault = self._script.pop(aimed)[2]
                if fault == "latency":
                    fault, f = None, -1.0
            elif u < r["slowdown"]:
                fault = "slowdown"
            elif v < r["reset"]:
                fault = "reset"
            elif method in WRITES and w < r["lost_ack"]:
                fault = "lost_ack"
            elif method == "GET" and w < r["cut"]:
                fault = "cut"
            delay = 0.0
            if f < r["latency"]:
                lo, hi = self.latency_s
                delay = lo + (hi - lo) * self._rng.random()
            if self.log is not None:
                self.log.append((method, path, fault))
            return fault, self._rng.random() * 0.9, delay

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Body:
    """The request body as a file http.client reads from: `n` bytes of a Content-Length body."""

    def __init__(self, rfile, n: int):
        self._f, self._left = rfile, n

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._f.read(size)
        if not data:
            raise ConnectionError("the client closed the connection mid-body")
        self._left -= len(data)
        return data


def _chunks(rfile):
    """A chunked request body, chunk by chunk (trailers dropped)."""
    while True:
        line = rfile.readline(65537)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return
        data = rfile.read(size)
        rfile.readline(65537)
        yield data


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultStore
    _upstream: http.client.HTTPConnection | None = None

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms wait per answer

    def log_message(self, *args):  # quiet
        pass

    def _drain(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            for _ in _chunks(self.rfile):
                pass
            return
        body = _Body(self.rfile, int(self.headers.get("Content-Length") or 0))
        while body.read(1 << 20):
            pass

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _answer(self, status: int, reason: str, body: bytes, extra: dict | None = None) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self) -> http.client.HTTPResponse:
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        body = _chunks(self.rfile) if chunked else (
            _Body(self.rfile, int(self.headers["Content-Length"])) if self.headers.get("Content-Length") else None)
        for attempt in (0, 1):  # a kept-alive upstream connection the store closed: one new one
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.proxy.target, timeout=300)
                self._upstream.connect()
                self._upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._upstream
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    conn.putheader(k, v)
                if chunked:
                    conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders()
                if body is not None:
                    for block in (body if chunked else iter(lambda: body.read(1 << 16), b"")):
                        conn.send(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                    if chunked:
                        conn.send(b"0\r\n\r\n")
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self._upstream = None
                if attempt or body is not None:  # a body already sent cannot be sent again
                    raise
        raise AssertionError("unreachable")

    def _relay(self, resp: http.client.HTTPResponse, cut: float | None) -> None:
        data = None
        length = resp.getheader("Content-Length")
        if self.command == "HEAD" or resp.status in (204, 304):
            resp.read()
            length = length if self.command == "HEAD" else "0"
        elif length is None:  # chunked from the store: sent on with a length
            data = resp.read()
            length = str(len(data))
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                self.send_header(k, v)
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if self.command == "HEAD" or resp.status in (204, 304):
            return
        total = int(length)
        stop = int(total * cut) if cut is not None else total
        sent = 0
        while sent < stop:
            block = data[sent:stop] if data is not None else resp.read(min(1 << 16, stop - sent))
            if not block:
                break
            self.wfile.write(block)
            sent += len(block)
        if cut is None:
            resp.read()  # the end of the answer (nothing left): the store's connection is free again
            return
        self.wfile.flush()
        self.proxy.count("cut")
        self.close_connection = True
        self._upstream.close()  # the rest of the store's answer is dropped with its connection
        self._upstream = None
        self.connection.shutdown(socket.SHUT_RDWR)  # a clean close: the body ends short of its length

    def _handle(self) -> None:
        fault, cut, delay = self.proxy.decide(self.command, self.path)
        if delay:
            self.proxy.count("latency")
            time.sleep(delay)
        if fault == "reset":
            self.proxy.count("reset")
            self._reset()
            return
        if fault == "slowdown":
            self._drain()
            self.proxy.count("slowdown")
            extra = {"Retry-After": str(self.proxy.retry_after)} if self.proxy.retry_after is not None else {}
            self._answer(503, "Slow Down", s3_error("SlowDown", "Please reduce your request rate."), extra)
            return
        resp = self._forward()
        if fault == "lost_ack":
            resp.read()
            self.proxy.count("lost_ack")
            self._answer(500, "Internal Server Error",
                         s3_error("InternalError", "We encountered an internal error. Please try again."))
            return
        body_len = int(resp.getheader("Content-Length") or 0)
        self._relay(resp, cut if fault == "cut" and resp.status in (200, 206) and body_len > 1 else None)

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (ConnectionError, OSError):
            self.close_connection = True

    def do_GET(self):
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass
        if self._upstream is not None:
            self._upstream.close()


@contextlib.contextmanager
def through(target: str, **kw):
    """A FaultStore in front of `target`, with AWS_ENDPOINT_URL pointing at it in this process for the
    block (Storage objects opened inside it talk to the proxy; those opened before keep their client)."""
    import os
    with FaultStore(target, **kw) as fs:
        saved = os.environ.get("AWS_ENDPOINT_URL")
        os.environ["AWS_ENDPOINT_URL"] = fs.endpoint
        try:
            yield fs
        finally:
            if saved is None:
                os.environ.pop("AWS_ENDPOINT_URL", None)
            else:
                os.environ["AWS_ENDPOINT_URL"] = saved
