"""A local HTTP server for the download tests: serves a folder on 127.0.0.1, with Range support,
and misbehaves on demand, file by file.

    with FixtureServer(root) as server:
        server.faults["model.ckpt.index"] = "cut"   # see FAULTS
        ...fetch f"{server.url}/<folder>/<file>"...
        server.requests                            # [(path, Range header or None), ...]
"""
import re
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
FAULTS = ("cut", "ignore_range", *ERROR_REPLIES)  # cut: announce the full length, send half


class FixtureServer:
    def __init__(self, root, handler=None):  # handler: a _Handler subclass (tests/test_hf_hub.py's Hub)
        self.root = Path(root).resolve()
        self.faults = {}    # file name -> one of FAULTS
        self.requests = []  # (path, Range header or None), in arrival order
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
        if not path.is_relative_to(fixture.root) or not path.is_file():
            return self._reply(404, "text/plain", b"Not Found")
        data = path.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if not m or fault == "ignore_range":
            return self._reply(200, "application/octet-stream", data, cut=fault == "cut")
        start = int(m[1])
        if start >= len(data):
            return self._reply(416, "text/plain", b"Range Not Satisfiable")
        content_range = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._reply(206, "application/octet-stream", data[start:], fault == "cut", content_range)

    def _reply(self, status, content_type, body, cut=False, content_range=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))  # the full length, even when cut
        if content_range:
            self.send_header("Content-Range", content_range)
        self.end_headers()
        self.wfile.write(body[:len(body) // 2] if cut else body)
        self.close_connection = True  # a cut transfer ends here, half-way through the body

    def log_message(self, *args):
        pass  # keep test output quiet
