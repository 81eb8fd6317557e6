"""A fake zeusd: HTTP on a real Unix socket, the routes Perseus uses, over simulated GPUs.

It follows zeusd's documented API (docs/zeusd/api.md and zeusd/README.md of ml-energy/zeus; the
table is in docs/gpu.md): query parameters, ``block``, per-GPU ``{"errors": {id: message}}`` on
failed writes, JWT-like bearer tokens with API-group scopes (401 without a valid token, 403 for a
missing scope), 404 for a disabled API group. Tokens here are plain strings mapped to
``(user, scopes)``; the real daemon verifies signed JWTs, which changes nothing on the client side.

Use it in-process (``with FakeZeusd(path, sim_dir=...) as z:``; ``z.requests`` records every call)
or as a process: ``python tests/gpu/fake_zeusd.py --socket PATH --sim-dir DIR [--gpus 0,1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUPermissionError

if TYPE_CHECKING:
    from perseus.gpu.sim.device import SimulatedGPU

GROUPS = ("gpu-control", "gpu-read", "cpu-read")


def required_scope(path: str) -> str | None:
    if path in ("/discover", "/time"):
        return None
    if path.startswith(("/gpu/set_", "/gpu/reset_")):
        return "gpu-control"
    if path.startswith("/gpu/"):
        return "gpu-read"
    return None


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeZeusd:
    """Serves ``gpus`` (simulated GPU indices in ``sim_dir``) on ``socket_path``.

    ``tokens``: {token: (user, [scopes])}; when given, every route but /discover and /time needs
    one (auth on). ``enabled``: the API groups served. ``no_permission``: GPU ids whose writes fail
    as NVML ``NoPermission`` does in a daemon that is not root. ``legacy_discover``: answer
    /discover in the older ``{"gpu_ids": [...]}`` form.
    """

    def __init__(self, socket_path: str | Path, *, sim_dir: str | Path, gpus: tuple[int, ...] = (0,),
                 tokens: dict[str, tuple[str, list[str]]] | None = None, enabled: tuple[str, ...] = GROUPS,
                 no_permission: tuple[int, ...] = (), legacy_discover: bool = False) -> None:
        self.socket_path = str(socket_path)
        self.sim_dir = str(sim_dir)
        self.gpu_ids = tuple(gpus)
        self.tokens = tokens
        self.enabled = tuple(enabled)
        self.no_permission = set(no_permission)
        self.legacy_discover = legacy_discover
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.hold = threading.Lock()  # a test holding it stalls every request (a daemon stuck in the driver)
        self._devices: dict[int, SimulatedGPU] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------------------
    def start(self) -> FakeZeusd:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        fake = self

        class Handler(_Handler):
            zeusd = fake

        self._server = _Server(self.socket_path, Handler)
        os.chmod(self.socket_path, 0o666)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-zeusd", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        for dev in self._devices.values():
            dev.close()
        self._devices.clear()

    def __enter__(self) -> FakeZeusd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def calls(self, path: str) -> list[dict[str, str]]:
        """The query parameters of every request on ``path`` so far."""
        return [params for _, p, params in list(self.requests) if p == path]

    # -- devices --------------------------------------------------------------------------------
    def device(self, gpu_id: int) -> SimulatedGPU:
        from perseus.gpu.sim.device import SimulatedGPU

        with self._lock:
            if gpu_id not in self._devices:
                self._devices[gpu_id] = SimulatedGPU(gpu_id, state_dir=self.sim_dir)
            return self._devices[gpu_id]

    # -- the API --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, params: dict[str, str], auth: str | None) -> tuple[int, object]:
        with self.hold:
            self.requests.append((method, path, params))
        scope = required_scope(path)
        if scope is not None and scope not in self.enabled:
            return 404, {"error": f"API group '{scope}' is not enabled on this server."}
        if path.startswith("/auth/") and self.tokens is None:
            return 404, {"error": "Authentication is not enabled on this server."}
        claims = None
        if self.tokens is not None and path not in ("/discover", "/time"):
            token = auth[len("Bearer "):] if auth and auth.startswith("Bearer ") else None
            if token is None:
                return 401, {"error": "Authentication required. Provide an Authorization: Bearer <token> header."}
            if token not in self.tokens:
                return 401, {"error": "Invalid token: InvalidSignature"}
            claims = self.tokens[token]
            if scope is not None and scope not in claims[1]:
                return 403, {"error": f"Token for user '{claims[0]}' lacks required scope '{scope}'. "
                                      f"Token scopes: {claims[1]}"}
        if method == "GET" and path == "/discover":
            if self.legacy_discover:
                return 200, {"gpu_ids": list(self.gpu_ids), "cpu_ids": [], "dram_available": []}
            return 200, {"gpus": [{"id": i, "name": "simulated", "pci_address": f"0000:{i:02x}:00.0",
                                   "cumulative_energy_available": True} for i in self.gpu_ids],
                         "cpus": [], "enabled_api_groups": list(self.enabled), "auth_required": self.tokens is not None}
        if method == "GET" and path == "/time":
            return 200, {"timestamp_ms": int(time.time() * 1000)}
        if method == "GET" and path == "/auth/whoami":
            return 200, {"sub": claims[0], "scopes": claims[1]} if claims else {}
        if path.startswith("/gpu/"):
            return self._gpu(method, path[len("/gpu/"):], params)
        return 404, {"error": f"no route {method} {path}"}

    def _gpu(self, method: str, op: str, params: dict[str, str]) -> tuple[int, object]:
        try:
            ids = [int(x) for x in params["gpu_ids"].split(",")] if "gpu_ids" in params else list(self.gpu_ids)
        except ValueError:
            return 400, {"error": f"bad gpu_ids {params.get('gpu_ids')!r}"}
        unknown = [i for i in ids if i not in self.gpu_ids]
        if unknown:
            return 400, {"errors": {str(i): f"GPU {i} not found" for i in unknown}}
        if method == "GET":
            if op == "get_cumulative_energy":
                return 200, {str(i): {"energy_mj": int(self.device(i).total_energy_j() * 1000)} for i in ids}
            if op == "get_power":
                return 200, {"timestamp_ms": int(time.time() * 1000),
                             "power_mw": {str(i): int(self.device(i).power_w() * 1000) for i in ids}}
            return 404, {"error": f"no route GET /gpu/{op}"}
        if params.get("block") not in ("true", "false"):
            return 400, {"error": "query parameter block (true|false) is required"}
        try:
            args = {k: int(params[k]) for k in ("min_clock_mhz", "max_clock_mhz", "power_limit_mw") if k in params}
        except ValueError:
            return 400, {"error": "clock and power parameters are integers"}
        errors: dict[str, tuple[int, str]] = {}
        for i in ids:
            if i in self.no_permission:
                errors[str(i)] = (403, "NVML error: Insufficient Permissions")
                continue
            dev = self.device(i)
            try:
                if op == "set_gpu_locked_clocks":
                    if args.get("min_clock_mhz") != args.get("max_clock_mhz"):
                        raise GPUInvalidArgumentError("the fake locks one clock: min_clock_mhz = max_clock_mhz")
                    dev.set_locked_sm_clock(args["max_clock_mhz"])
                elif op == "reset_gpu_locked_clocks":
                    dev.reset_locked_sm_clock()
                elif op == "set_mem_locked_clocks":
                    dev.lock_memory_clock(args["max_clock_mhz"])
                elif op == "reset_mem_locked_clocks":
                    dev.reset_memory_clock()
                elif op == "set_power_limit":
                    dev.set_power_limit_w(args["power_limit_mw"] / 1000.0)
                else:
                    return 404, {"error": f"no route POST /gpu/{op}"}
            except KeyError as exc:
                return 400, {"error": f"missing query parameter {exc}"}
            except GPUInvalidArgumentError as exc:
                errors[str(i)] = (400, str(exc))
            except GPUPermissionError as exc:
                errors[str(i)] = (403, str(exc))
            except GPUError as exc:
                errors[str(i)] = (500, str(exc))
        if errors:
            return max(code for code, _ in errors.values()), {"errors": {k: m for k, (_, m) in errors.items()}}
        return 200, None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as actix-web serves it
    zeusd: FakeZeusd

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        try:
            status, body = self.zeusd.handle(method, url.path, params, self.headers.get("Authorization"))
        except Exception as exc:  # noqa: BLE001 - a fake's bug must show as a 500, not hang the client
            status, body = 500, {"error": f"fake zeusd: {exc!r}"}
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: object) -> None:  # quiet, and no peer address on AF_UNIX
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--sim-dir", required=True)
    ap.add_argument("--gpus", default="0")
    args = ap.parse_args()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with FakeZeusd(args.socket, sim_dir=args.sim_dir, gpus=tuple(int(g) for g in args.gpus.split(","))):
        print("ready", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
