"""Screenshots of the built docs site with headless Chromium (``make docs-screenshot``).

``python docs/_screenshot.py SITE OUT``: serves the built site SITE on a free
port of 127.0.0.1, takes a screenshot of each page of :data:`PAGES` with
``chromium --headless`` into the folder OUT, and stops the server.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

#: (file name, page of the site and the section to show, window height).
PAGES = (
    ("site-home.png", "", 1000),
    ("site-onion.png", "concepts/#the-onion-in-a-picture", 1250),
    ("site-trace.png", "cli/#a-run-as-a-picture", 2000),
    ("site-early-close.png", "streaming/#early-close-in-a-picture", 1500),
    ("site-api.png", "api/", 1200),
)

# Headless Chromium's --screenshot draws a page opened at a #section shifted and half
# blank; a page that shows the section in a full-window frame is drawn right.
_FRAME = (
    '<!doctype html><html><body style="margin:0"><iframe src="/{page}" '
    'style="border:0;width:100vw;height:100vh"></iframe></body></html>'
)


def _quiet_handler(root: Path) -> type[http.server.SimpleHTTPRequestHandler]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/_frame/"):
                page = urllib.parse.unquote(self.path.removeprefix("/_frame/"))
                body = _FRAME.format(page=page).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return functools.partial(Handler, directory=str(root))  # type: ignore[return-value]


def screenshots(site: Path, out: Path) -> list[Path]:
    """Take the screenshots of :data:`PAGES`; the paths written."""
    browser = shutil.which("chromium")
    if browser is None:
        raise SystemExit("chromium is not installed: make chromium")
    if not (site / "index.html").exists():
        raise SystemExit(f"{site}/index.html is missing: make docs first")
    out.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    written = []
    try:
        port = server.server_address[1]
        for name, page, height in PAGES:
            path = out / name
            subprocess.run(
                [
                    browser,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--window-size=1280,{height}",
                    # Time for the page's scripts (Mermaid draws the diagrams) to run.
                    "--virtual-time-budget=10000",
                    f"--screenshot={path}",
                    f"http://127.0.0.1:{port}/_frame/{page.replace('#', '%23')}",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            written.append(path)
    finally:
        server.shutdown()
        server.server_close()
    return written


if __name__ == "__main__":
    for written in screenshots(Path(sys.argv[1]), Path(sys.argv[2])):
        print(written)
