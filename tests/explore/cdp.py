"""A headless Chromium driven over the Chrome DevTools Protocol, for the browser tests of `humanset browse`.

The protocol runs over a pipe (`--remote-debugging-pipe`: Chromium reads commands from descriptor 3
and writes replies and events to descriptor 4, each message JSON ending in a NUL byte), so the tests
need no WebSocket client, no port and no driver binary: Debian's `chromium` alone, with the flags the
report test uses. `Browser` opens one page; `evaluate` runs JavaScript there and returns its value,
`wait_for` polls an expression until it is truthy, `click` clicks an element with the mouse, `key`
types a key, `screenshot` saves a PNG.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--disable-extensions", "--window-size=1400,1000"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, chromium: str, profile, timeout: float = 60.0):
        self.timeout = timeout
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds():  # the child's descriptors 3 and 4, whatever numbers the pipes got here
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                                      "about:blank"], preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            for m in self._messages(deadline):
                if m.get("id") == self._id:
                    if "error" in m:
                        raise CDPError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)

    def _messages(self, deadline: float):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {self.timeout:.0f} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise CDPError(f"chromium exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            self._buf += chunk
        *done, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in done]

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str, await_promise: bool = True):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": await_promise})
        if "exceptionDetails" in r:
            raise CDPError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, what: str = ""):
        """The expression's value once it is truthy (polled every 100 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            try:  # a DOM node comes back by value as {}: count it as found
                v = self.evaluate(f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()")
            except CDPError:
                v = None
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what or expression}; console: {self.console()[-5:]}")
            time.sleep(0.1)

    SPECIAL = {"Enter": (13, "\r"), "Escape": (27, None), "ArrowLeft": (37, None), "ArrowRight": (39, None),
               "ArrowUp": (38, None), "ArrowDown": (40, None), "Tab": (9, None)}

    def key(self, key: str, code: str | None = None, shift: bool = False) -> None:
        """A key press as a user types it (keydown with its text, keyup); a named key ("Enter",
        "ArrowRight") with its key code, so the browser's default action (following a link) happens."""
        vk, text = self.SPECIAL.get(key, (ord(key.upper()) if len(key) == 1 else 0, key if len(key) == 1 else None))
        if code is None:
            code = f"Key{key.upper()}" if len(key) == 1 and key.isalpha() else key
        params = {"key": key, "code": code, "modifiers": 8 if shift else 0, "windowsVirtualKeyCode": vk}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", **params,
                                             **({"text": text} if text else {})})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **params})

    def click(self, selector: str) -> None:
        """A mouse click in the middle of the first element `selector` matches, scrolled into view."""
        box = self.wait_for(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return r.width > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()""", what=selector)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def console(self) -> list[str]:
        """Console messages and errors the page logged (CSP violations, exceptions, failed loads)."""
        out = []
        for e in self.events:
            if e.get("method") == "Runtime.consoleAPICalled":
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"]))
            elif e.get("method") == "Runtime.exceptionThrown":
                out.append(str(e["params"]["exceptionDetails"].get("exception", {}).get("description")))
            elif e.get("method") == "Log.entryAdded":
                out.append(f"{e['params']['entry']['level']}: {e['params']['entry']['text']}")
        return out

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False)
        except (CDPError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()
