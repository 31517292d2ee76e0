"""Check in a headless browser that Prefect's UI shows a retrain run's pictures, and screenshot them.

    python tools/ui_screenshot.py [--work work/ui-check] [--out docs/retrain-pictures.png] [--customers 1500]

It starts a throwaway Prefect server (its own PREFECT_HOME under --work, a free port), runs the vertical
demo's retrain twice against it (two versions: the metric-across-versions picture has two points), opens
the newest `model-pictures` artifact's page in Chromium (playwright driving the system's `chromium`, or
--chromium PATH) and fails unless every picture is an image the browser decoded (no broken image). Then it
saves a screenshot of the page to --out. Needs the `[ui-check]` extra (playwright) and Debian's `chromium`
(`apt-get install -y chromium`); `tests/flows/test_ui_pictures.py` runs it (slow; skipped without chromium).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

EXPECTED = ("confusion", "roc", "precision_recall", "calibration", "importances", "history")
"""The pictures of a vertical binary classifier's second version (`fedcore.models.pictures`)."""


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def api(url: str, path: str, body: dict | None = None) -> object:
    """A JSON call to the Prefect server's REST API (POST with `body`, else GET)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Wait until the server answers its health check (or fail, naming its log)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"ui_screenshot: the Prefect server exited with {server.returncode}")
        try:
            api(url, "/health")
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"ui_screenshot: the Prefect server did not answer {url}/health in {timeout_s:.0f} s")


def newest_artifact(url: str, key: str) -> dict:
    """The newest artifact called `key` on the server."""
    found = api(url, "/artifacts/filter", {"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC",
                                           "limit": 1})
    if not found:
        raise SystemExit(f"ui_screenshot: no {key!r} artifact on the server: the retrain did not publish it")
    return found[0]  # type: ignore[index]


def check_page(page_url: str, out: Path, chromium: str) -> list[str]:
    """Open `page_url`, require every EXPECTED picture decoded, screenshot to `out`; the pictures' names."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 1800})
        page.goto(page_url, wait_until="networkidle")
        page.wait_for_selector("img[alt='history']", timeout=60_000)
        images = page.eval_on_selector_all(
            "img", "all => all.map(i => ({alt: i.alt, src: i.src.slice(0, 26), complete: i.complete, "
                   "width: i.naturalWidth}))")
        pictures = [i for i in images if i["src"].startswith("data:image/svg+xml")]
        broken = [i["alt"] for i in pictures if not i["complete"] or i["width"] == 0]
        missing = sorted(set(EXPECTED) - {i["alt"] for i in pictures})
        if broken or missing:
            raise SystemExit(f"ui_screenshot: {page_url}: broken images {broken}, missing pictures {missing}")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True, type="png")
        browser.close()
    return [i["alt"] for i in pictures]


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit 0 with the screenshot written, or a one-line reason."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("work/ui-check"), help="throwaway folder")
    parser.add_argument("--out", type=Path, default=Path("docs/retrain-pictures.png"), help="screenshot file")
    parser.add_argument("--customers", type=int, default=1500, help="the demo's customers (small: fast)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium",
                        help="the Chromium binary playwright drives (default: chromium on PATH)")
    args = parser.parse_args(argv)
    if not shutil.which(args.chromium) and not Path(args.chromium).is_file():
        raise SystemExit(f"ui_screenshot: no Chromium at {args.chromium!r}: apt-get install -y chromium, or "
                         "pass --chromium PATH")
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / ".prefect").mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(work / ".prefect"), "PREFECT_API_URL": url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    prefect = Path(sys.executable).with_name("prefect")
    with open(work / "server.log", "wb") as log:
        command = [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, server)
        fedforest = [sys.executable, "-c", "from fedcore.cli import main; raise SystemExit(main())"]
        for _ in range(2):  # two versions: the history picture has two points
            subprocess.run([*fedforest, "demo", "--work", str(work / "demo"), "--customers",
                            str(args.customers)], env=env, check=True)
        artifact = newest_artifact(url, "model-pictures")
        page_url = f"http://127.0.0.1:{port}/artifacts/artifact/{artifact['id']}"  # type: ignore[index]
        shown = check_page(page_url, args.out, args.chromium)
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"ui_screenshot: {page_url} shows {', '.join(shown)}; screenshot {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
