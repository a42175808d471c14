"""A local HTTP server for the download tests: serves a folder on 127.0.0.1, with Range support,
and misbehaves on demand, file by file.

    with FixtureServer(root) as server:
        server.faults["model.ckpt.index"] = "cut"   # see FAULTS
        ...fetch f"{server.url}/<folder>/<file>"...
        server.requests                            # [(path, Range header or None), ...]

A Range past the end is answered 416 with `Content-Range: bytes */<size>` (RFC 9110 15.5.17).
"""
import re
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# What the old storage.googleapis.com location answers for a missing object.
XML_ERROR = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code>"
             b"<Message>The specified key does not exist.</Message></Error>")
HTML_ERROR = b"<!DOCTYPE html>\n<html><body><h1>503 Service Unavailable</h1></body></html>\n"
# fault -> (status, Content-Type, body) for the faults that replace the file with an error body
ERROR_REPLIES = {
    "404": (404, "text/plain", b"Not Found"),
    "xml404": (404, "application/xml", XML_ERROR),
    "xml200": (200, "application/octet-stream", XML_ERROR),  # only the first bytes give it away
    "html": (200, "text/html; charset=utf-8", HTML_ERROR),
}
# How a transfer can go wrong (each sends half the body, except nolength and bare416):
TRANSFER_FAULTS = {
    "cut": "announce the full Content-Length, send half, close (a short body)",
    "nolength_cut": "no Content-Length (the body ends when the connection closes), send half, close",
    "reset": "announce the full Content-Length, send half, then reset the connection (TCP RST)",
    "nolength_reset": "no Content-Length, send half, then reset the connection",
    "nolength": "no Content-Length, send the whole body, close",
    "bare416": "answer 416 without the Content-Range that says the file's size",
    "flip": "send the whole body with one byte changed half-way (a transfer the byte count cannot catch)",
    "hold": "send half, then wait for server.release (an Event) before the rest: a download in progress",
    "trickle": "announce the full Content-Length, send half, then a byte every 0.05 s (a stalled server)",
    "nolength_trickle": "no Content-Length, send half, then a byte every 0.05 s",
    "loop": "redirect to itself, for ever",
}
FAULTS = ("ignore_range", *TRANSFER_FAULTS, *ERROR_REPLIES)


class FixtureServer:
    def __init__(self, root, handler=None):  # handler: a _Handler subclass (tests/checkpoints/test_hf_hub.py's Hub)
        self.root = Path(root).resolve()
        self.faults = {}    # file name -> one of FAULTS
        self.requests = []  # (path, Range header or None), in arrival order
        self.release = threading.Event()  # lets a "hold" transfer finish
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler or _Handler)  # port 0: any free port
        self._httpd.daemon_threads = True
        self._httpd.fixture = self
        self.url = f"http://127.0.0.1:{self._httpd.server_port}"

    def __enter__(self):
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    timeout = 5  # seconds: a stalled client cannot hold a server thread for long

    def do_GET(self):
        fixture = self.server.fixture
        fixture.requests.append((self.path, self.headers.get("Range")))
        fault = fixture.faults.get(self.path.rsplit("/", 1)[-1])
        path = (fixture.root / self.path.lstrip("/")).resolve()
        if fault in ERROR_REPLIES:
            return self._reply(*ERROR_REPLIES[fault])
        if fault == "loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if not path.is_relative_to(fixture.root) or not path.is_file():
            return self._reply(404, "text/plain", b"Not Found")
        data = path.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if not m or fault == "ignore_range":
            return self._reply(200, "application/octet-stream", data, fault)
        start = int(m[1])
        if start >= len(data):
            content_range = None if fault == "bare416" else f"bytes */{len(data)}"
            return self._reply(416, "text/plain", b"Range Not Satisfiable", content_range=content_range)
        content_range = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._reply(206, "application/octet-stream", data[start:], fault, content_range)

    def _reply(self, status, content_type, body, fault=None, content_range=None):
        cut = fault in ("cut", "nolength_cut", "reset", "nolength_reset")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if fault not in ("nolength", "nolength_cut", "nolength_reset", "nolength_trickle"):
            self.send_header("Content-Length", str(len(body)))  # the full length, even when cut
        if content_range:
            self.send_header("Content-Range", content_range)
        self.end_headers()
        if fault == "flip":
            body = body[:len(body) // 2] + bytes([body[len(body) // 2] ^ 0xFF]) + body[len(body) // 2 + 1:]
        if fault == "hold":
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.server.fixture.release.wait(timeout=30)
            body = body[len(body) // 2:]
        if fault in ("trickle", "nolength_trickle"):
            return self._trickle(body)
        self.wfile.write(body[:len(body) // 2] if cut else body)
        self.close_connection = True  # a cut transfer ends here, half-way through the body
        if fault in ("reset", "nolength_reset"):  # linger 0: close() sends RST, not FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _trickle(self, body):
        self.wfile.write(body[:len(body) // 2])
        self.wfile.flush()
        for i in range(len(body) // 2, len(body)):  # until the client gives up (a write fails) or 60 s pass
            if i - len(body) // 2 > 1200 or self.server.fixture.release.wait(0.05):
                break
            try:
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
            except OSError:
                break
        self.close_connection = True

    def log_message(self, *args):
        pass  # keep test output quiet
