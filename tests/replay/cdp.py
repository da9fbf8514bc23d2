"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only).

Chromium reads CDP commands from file descriptor 3 and writes replies and events to descriptor 4, each
message a JSON object followed by a NUL byte. No websocket, no browser download, no extra dependency: the
test drives Debian's ``chromium`` as installed by ``.ci/setup --dev``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root in CI
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page attached (flattened session)."""

    def __init__(self, binary: str, user_data_dir: Path, *, width: int = 1400, height: int = 900):
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Copy the child's ends to free descriptors >= 10 so the dup2 onto 3 and 4 cannot clobber one another.
        hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)

        def wire() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={user_data_dir}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(3, 4),
            preexec_fn=wire,
        )
        for fd in {to_chrome_r, from_chrome_w, hi_r, hi_w}:
            os.close(fd)
        self._w = to_chrome_w
        self._r = from_chrome_r
        self._next = 0
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._replies: dict[int, dict[str, Any]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = ""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # -- transport ----------------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._inbox.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                self._inbox.put(json.loads(raw))

    def _pump(self, deadline: float) -> None:
        msg = self._inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if msg is None:
            err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
            raise CDPError(f"chromium closed the pipe (exit {self.proc.poll()}): {err}")
        if "id" in msg:
            self._replies[int(msg["id"])] = msg
        else:
            self.events.append(msg)

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        self._next += 1
        mid = self._next
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while mid not in self._replies:
            if time.monotonic() > deadline:
                raise CDPError(f"{method}: no reply in {timeout}s")
            try:
                self._pump(deadline)
            except queue.Empty:
                continue
        reply = self._replies.pop(mid)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def wait_event(self, method: str, *, timeout: float = 30.0, since: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.events[since:]:
                if ev.get("method") == method:
                    return dict(ev.get("params", {}))
            if time.monotonic() > deadline:
                raise CDPError(f"no {method} event in {timeout}s")
            try:
                self._pump(deadline)
            except queue.Empty:
                continue

    # -- page helpers -------------------------------------------------------------------------------
    def navigate(self, url: str) -> None:
        since = len(self.events)
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", since=since)

    def eval(self, expression: str) -> Any:
        res = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in res:
            raise CDPError(f"JS exception in {expression[:80]!r}: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def center(self, selector: str) -> tuple[float, float]:
        """The element's centre in viewport pixels, scrolled into view first if it is not.

        Input events are hit-tested against the last committed frame, so after a scroll wait for two
        animation frames (and Chromium's synthetic move to the old pointer position) before moving."""
        rect = self.eval(
            f"(async () => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " let r = e.getBoundingClientRect();"
            " if (r.top < 0 || r.bottom > innerHeight || r.left < 0 || r.right > innerWidth) {"
            "   e.scrollIntoView({block: 'center'});"
            "   await new Promise(ok => requestAnimationFrame(() => requestAnimationFrame(ok)));"
            "   await new Promise(ok => setTimeout(ok, 250));"
            "   r = e.getBoundingClientRect(); }"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if rect is None:
            raise CDPError(f"no element matches {selector!r}")
        return float(rect[0]), float(rect[1])

    def mouse(self, kind: str, x: float, y: float) -> None:
        params: dict[str, Any] = {
            "type": kind,
            "x": x,
            "y": y,
            "button": "left" if kind != "mouseMoved" else "none",
        }
        if kind != "mouseMoved":
            params["clickCount"] = 1
        self.send("Input.dispatchMouseEvent", params)

    def click(self, selector: str) -> None:
        """A real mouse click (move, press, release) at the element's centre."""
        x, y = self.center(selector)
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def hover(self, selector: str) -> None:
        x, y = self.center(selector)
        self.mouse("mouseMoved", x, y)
        # A scroll earlier may still deliver a synthetic move to the pointer's old position after ours;
        # settle, then move again so the hover ends on the element.
        time.sleep(0.3)
        self.mouse("mouseMoved", x + 0.5, y)

    def type_text(self, selector: str, text: str) -> None:
        self.click(selector)
        self.send("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(data)
        return data

    def exceptions(self) -> list[dict[str, Any]]:
        return [e["params"] for e in self.events if e.get("method") == "Runtime.exceptionThrown"]

    def requested_urls(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
