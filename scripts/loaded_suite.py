"""Run the test suite while other CPU-bound processes compete for the machine.

    python scripts/loaded_suite.py                 # 2 busy processes beside `python -m pytest -q`
    python scripts/loaded_suite.py --hogs 3 -- tests/megatron -x

Why: CI machines and developers' machines are shared, so the suite must not depend on how busy
the cores are. This is how it is checked before a change lands (docs/reliability.md). The hogs
are plain Python busy loops at normal priority, one process each, started before pytest and
killed when it ends (also on Ctrl-C); pytest's exit status is returned.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time


def _spin(stop_after_s: float, parent: int) -> None:
    """Burn one core until killed, the launcher is gone, or ``stop_after_s`` passed (safety nets)."""
    deadline = time.monotonic() + stop_after_s
    x = 0
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the suite (default 2)")
    parser.add_argument("--limit-s", type=float, default=3600.0, help="hogs stop by themselves after this long")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (default: -q)")
    args = parser.parse_args(argv)
    if args.hogs < 0:
        parser.error("--hogs must be >= 0")
    ctx = mp.get_context("spawn")
    hogs = [ctx.Process(target=_spin, args=(args.limit_s, os.getpid()), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    print(f"loaded_suite: {args.hogs} busy processes ({', '.join(str(h.pid) for h in hogs) or 'none'}) "
          f"beside pytest on {os.cpu_count()} cores", flush=True)
    started = time.monotonic()
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", *(args.pytest_args or ["-q"])])
    except KeyboardInterrupt:
        rc = 128 + signal.SIGINT
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.join(5)
    print(f"loaded_suite: pytest exited {rc} after {time.monotonic() - started:.0f} s with {args.hogs} busy processes",
          flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
