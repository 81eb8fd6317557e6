"""Screenshot an HTML report with a headless Chromium: ``python scripts/render_report.py REPORT.html OUT.png``.

Checks that ``perseus report`` pages render in a real browser (and makes docs/img/report.png).
Needs Chromium (Debian: ``apt-get install -y chromium``); the test suite does not. Options:
``--width``/``--height`` of the window (default 1400 x 2400), ``--browser`` to name the binary,
``--colors N`` to store the screenshot with an N-color palette (Pillow; docs/img/report.png uses 256).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def render(report: Path, out: Path, width: int = 1400, height: int = 2400, browser: str | None = None,
           colors: int | None = None) -> None:
    exe = browser or next((b for b in BROWSERS if shutil.which(b)), None)
    if exe is None:
        raise SystemExit("render_report: no Chromium found; apt-get install -y chromium (or pass --browser)")
    if not report.is_file():
        raise SystemExit(f"render_report: {report}: no such file")
    with tempfile.TemporaryDirectory(prefix="perseus-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={out.resolve()}",
               f"--window-size={width},{height}", report.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"render_report: {exe} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    if colors:
        from PIL import Image

        with Image.open(out) as image:
            small = image.convert("RGB").quantize(colors=colors, method=Image.Quantize.FASTOCTREE,
                                                  dither=Image.Dither.NONE)
        small.save(out, optimize=True)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("--browser")
    parser.add_argument("--colors", type=int, help="palette size of the saved PNG (smaller file)")
    args = parser.parse_args(argv)
    render(args.report, args.out, args.width, args.height, args.browser, args.colors)


if __name__ == "__main__":
    main(sys.argv[1:])
