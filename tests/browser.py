"""Drive headless Chromium over the DevTools protocol: open a page, wait, read the DOM, screenshot.

Only the playground test and its README screenshot use this. Chromium is Debian's `chromium`
package (.ci/run installs it when it can); the protocol is JSON over a websocket
(https://chromedevtools.github.io/devtools-protocol/), spoken here through websocket-client.
"""
import base64
import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.request

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0"]


def chromium_path():
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium and a websocket to its first page."""

    def __init__(self, profile_dir, width=1200, height=760):
        import websocket
        self.process = subprocess.Popen([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}",
                                         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        port = self._devtools_port()
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(p for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def _devtools_port(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # Chromium prints "DevTools listening on ws://127.0.0.1:PORT/..."
            line = self.process.stderr.readline()
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools server")

    def call(self, method, **params):
        """Send one command; return its result (events that arrive meanwhile are dropped)."""
        message_id = next(self.ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url):
        self.call("Page.navigate", url=url)

    def wait_for(self, expression, timeout=60):
        """Poll a JavaScript expression until it is truthy; return its last value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        return value

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
