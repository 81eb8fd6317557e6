"""``ZeusdClient``: Zeus's privileged daemon, zeusd, spoken to over HTTP on its Unix socket.

Why: clusters that already run zeusd (https://ml.energy/zeus/zeusd/) give unprivileged jobs
clock control through it; Perseus uses it instead of needing CAP_SYS_ADMIN or ``perseus clockd``.
This module is only the HTTP edge: the routes (below, as zeusd documents them), their query
parameters, and zeusd's refusals turned into one-line typed errors. It is blocking; the trainer's
hooks never call it (the controller process does, ``zeusd.device.ZeusdGPU``).

Routes used (zeusd's ``docs/zeusd/api.md`` and ``zeusd/README.md``; scope = its auth API group):

=======  ==================================  ==============================================  ===========
method   path                                query                                           scope
=======  ==================================  ==============================================  ===========
GET      /discover                           --                                              none
GET      /auth/whoami                        -- (404 when zeusd runs without auth)           token only
POST     /gpu/set_gpu_locked_clocks          gpu_ids, min_clock_mhz, max_clock_mhz, block    gpu-control
POST     /gpu/reset_gpu_locked_clocks        gpu_ids, block                                  gpu-control
POST     /gpu/set_mem_locked_clocks          gpu_ids, min_clock_mhz, max_clock_mhz, block    gpu-control
POST     /gpu/reset_mem_locked_clocks        gpu_ids, block                                  gpu-control
POST     /gpu/set_power_limit                gpu_ids, power_limit_mw, block                  gpu-control
GET      /gpu/get_cumulative_energy          gpu_ids  -> {"<id>": {"energy_mj": N}}          gpu-read
GET      /gpu/get_power                      gpu_ids  -> {"timestamp_ms", "power_mw": {..}}  gpu-read
=======  ==================================  ==============================================  ===========

Status codes: 400 bad input, 401 missing or invalid token, 403 token lacks the scope (or NVML
``NoPermission`` in the daemon), 404 API group disabled (``--enable``); bodies are
``{"error": "..."}`` or, for per-GPU failures of a write, ``{"errors": {"<id>": "..."}}``.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Any

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUPermissionError

ENV_SOCKET = "PERSEUS_ZEUSD_SOCKET"
ENV_TOKEN = "ZEUSD_TOKEN"  # Zeus's own variable: one token serves Zeus and Perseus
CONTROL_SCOPE = "gpu-control"
READ_SCOPE = "gpu-read"
# Every route this client calls: (method, path). The fake daemon in the tests serves exactly these.
ROUTES = {
    "discover": ("GET", "/discover"),
    "whoami": ("GET", "/auth/whoami"),
    "set_gpu_locked_clocks": ("POST", "/gpu/set_gpu_locked_clocks"),
    "reset_gpu_locked_clocks": ("POST", "/gpu/reset_gpu_locked_clocks"),
    "set_mem_locked_clocks": ("POST", "/gpu/set_mem_locked_clocks"),
    "reset_mem_locked_clocks": ("POST", "/gpu/reset_mem_locked_clocks"),
    "set_power_limit": ("POST", "/gpu/set_power_limit"),
    "get_cumulative_energy": ("GET", "/gpu/get_cumulative_energy"),
    "get_power": ("GET", "/gpu/get_power"),
}


def zeusd_socket_from_env() -> str | None:
    """``$PERSEUS_ZEUSD_SOCKET``, or ``None`` when unset or empty."""
    value = os.environ.get(ENV_SOCKET, "").strip()
    return value or None


class ZeusdRefusedError(GPUPermissionError):
    """zeusd refused this process: no or a bad token, a missing scope, a disabled API group, or
    the daemon itself lacking the privilege. The message says which and what to change."""

    def __init__(self, what: str) -> None:
        self.what = what
        GPUError.__init__(self, what)


def _scope_of(path: str) -> str:
    return CONTROL_SCOPE if path.startswith(("/gpu/set_", "/gpu/reset_")) else READ_SCOPE


class ZeusdClient:
    """Blocking calls to one zeusd over its Unix socket (``httpx``, one kept-alive connection).

    ``token``: a zeusd JWT (default ``$ZEUSD_TOKEN``); sent as ``Authorization: Bearer`` when set.
    Thread-safe (one lock): the energy poller and a reset may share it.
    """

    def __init__(self, socket_path: str, *, token: str | None = None, timeout_s: float = 10.0) -> None:
        try:
            import httpx
        except ImportError:
            raise GPUError("the zeusd backend needs httpx: pip install 'perseus-energy[zeusd]' (or pip install httpx)") from None
        self.socket_path = str(socket_path)
        self._check_socket_file()
        self._httpx = httpx
        token = os.environ.get(ENV_TOKEN) if token is None else token
        self.has_token = bool(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(transport=httpx.HTTPTransport(uds=self.socket_path), headers=headers,
                                    base_url="http://zeusd", timeout=timeout_s)
        self._lock = threading.Lock()

    def _check_socket_file(self) -> None:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise GPUError(f"zeusd socket {self.socket_path} does not exist: is zeusd running on this node "
                           f"(zeusd serve --socket-path {self.socket_path}), and is {ENV_SOCKET} (or the "
                           "config's zeusd_socket) right?") from None
        except OSError as exc:
            raise GPUError(f"cannot look at the zeusd socket {self.socket_path} ({exc.strerror})") from None
        if not stat.S_ISSOCK(mode):
            raise GPUError(f"{self.socket_path} is not a socket; point {ENV_SOCKET} at zeusd's --socket-path")

    # -- the edge ----------------------------------------------------------------------------
    def call(self, route: str, **params: Any) -> Any:
        """One request on ``route`` (a key of ``ROUTES``); the decoded JSON body (None if empty)."""
        method, path = ROUTES[route]
        query = {k: _param(v) for k, v in params.items()}
        try:
            with self._lock:
                resp = self._client.request(method, path, params=query)
        except self._httpx.TransportError as exc:
            raise _connect_error(self.socket_path, exc) from None
        if resp.status_code == 200:
            return resp.json() if resp.content else None
        raise self._refusal(resp.status_code, path, _message(resp))

    def _refusal(self, status: int, path: str, message: str) -> GPUError:
        where = f"zeusd at {self.socket_path} refused {path} (HTTP {status}: {message})"
        scope = _scope_of(path)
        if status == 401:
            hint = (f"set {ENV_TOKEN} to a zeusd token with the {scope!r} scope (zeusd token issue)"
                    if not self.has_token else f"the token in {ENV_TOKEN} is invalid or expired; ask for a new one")
            return ZeusdRefusedError(f"{where}; {hint}")
        if status == 403:
            if "scope" in message.lower():
                return ZeusdRefusedError(f"{where}; ask the administrator for a token with the {scope!r} scope")
            return ZeusdRefusedError(f"{where}; zeusd itself may not do this (run zeusd as root), or use measure-only mode")
        if status == 404:
            return ZeusdRefusedError(f"{where}; this zeusd has the {scope!r} API group disabled (its --enable list)")
        if status == 400:
            return GPUInvalidArgumentError(where)
        return GPUError(where)

    # -- what Perseus asks of it -------------------------------------------------------------------
    def discover(self) -> dict[str, Any]:
        """``/discover``: GPU ids, enabled API groups, whether auth is required (older zeusd: ids only)."""
        data = self.call("discover")
        if not isinstance(data, dict):
            raise GPUError(f"zeusd at {self.socket_path} answered /discover with {data!r}, not an object")
        return data

    def gpu_ids(self, info: dict[str, Any]) -> list[int]:
        if isinstance(info.get("gpus"), list):
            return [int(g["id"]) for g in info["gpus"]]
        return [int(i) for i in info.get("gpu_ids", [])]

    def control_problem(self, gpu_id: int) -> str | None:
        """Why this process could not change ``gpu_id``'s clocks through zeusd, or None: the GPU is
        served, gpu-control is enabled, and (when zeusd requires auth) the token carries that scope.
        Changes nothing."""
        info = self.discover()
        ids = self.gpu_ids(info)
        if gpu_id not in ids:
            return f"zeusd at {self.socket_path} serves GPUs {ids}, not GPU {gpu_id}"
        groups = info.get("enabled_api_groups")
        if isinstance(groups, list) and CONTROL_SCOPE not in groups:
            return (f"zeusd at {self.socket_path} has the {CONTROL_SCOPE!r} API group disabled (enabled: "
                    f"{', '.join(groups) or 'none'}); start it with it in --enable, or use measure-only mode")
        if info.get("auth_required"):
            if not self.has_token:
                return (f"zeusd at {self.socket_path} requires a token; set {ENV_TOKEN} to one with the "
                        f"{CONTROL_SCOPE!r} scope (zeusd token issue)")
            try:
                scopes = self.call("whoami").get("scopes", [])
            except ZeusdRefusedError as exc:
                return exc.what
            if CONTROL_SCOPE not in scopes:
                return (f"the zeusd token in {ENV_TOKEN} has scopes {scopes}, not {CONTROL_SCOPE!r}; ask the "
                        "administrator for one that has it, or use measure-only mode")
        return None

    def set_gpu_locked_clocks(self, gpu_id: int, mhz: int) -> None:
        self.call("set_gpu_locked_clocks", gpu_ids=gpu_id, min_clock_mhz=mhz, max_clock_mhz=mhz, block=True)

    def reset_gpu_locked_clocks(self, gpu_id: int) -> None:
        self.call("reset_gpu_locked_clocks", gpu_ids=gpu_id, block=True)

    def set_mem_locked_clocks(self, gpu_id: int, mhz: int) -> None:
        self.call("set_mem_locked_clocks", gpu_ids=gpu_id, min_clock_mhz=mhz, max_clock_mhz=mhz, block=True)

    def reset_mem_locked_clocks(self, gpu_id: int) -> None:
        self.call("reset_mem_locked_clocks", gpu_ids=gpu_id, block=True)

    def set_power_limit_mw(self, gpu_id: int, mw: int) -> None:
        self.call("set_power_limit", gpu_ids=gpu_id, power_limit_mw=mw, block=True)

    def energy_mj(self, gpu_id: int) -> int:
        data = self.call("get_cumulative_energy", gpu_ids=gpu_id)
        try:
            return int(data[str(gpu_id)]["energy_mj"])
        except (KeyError, TypeError, ValueError):
            raise GPUError(f"zeusd at {self.socket_path} answered get_cumulative_energy without GPU {gpu_id}'s "
                           f"energy_mj: {data!r}") from None

    def power_mw(self, gpu_id: int) -> int:
        data = self.call("get_power", gpu_ids=gpu_id)
        try:
            return int(data["power_mw"][str(gpu_id)])
        except (KeyError, TypeError, ValueError):
            raise GPUError(f"zeusd at {self.socket_path} answered get_power without GPU {gpu_id}'s power_mw: "
                           f"{data!r}") from None

    def close(self) -> None:
        self._client.close()


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _message(resp: Any) -> str:
    """zeusd's error text: ``{"error": ...}``, per-GPU ``{"errors": {id: ...}}``, or the raw body."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:200] or "no body"
    if isinstance(body, dict):
        if "error" in body:
            return str(body["error"])
        if isinstance(body.get("errors"), dict):
            return "; ".join(f"GPU {k}: {v}" for k, v in body["errors"].items())
    return str(body)[:200]


def _connect_error(path: str, exc: Exception) -> GPUError:
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, PermissionError):
        return ZeusdRefusedError(f"this user may not connect to zeusd's socket {path} ({cause.strerror}); its "
                                 "--socket-permissions/--socket-gid decide who may")
    if isinstance(cause, FileNotFoundError):
        return GPUError(f"zeusd socket {path} disappeared (zeusd stopped?)")
    return GPUError(f"cannot talk to zeusd at {path} ({cause}); is zeusd running and is {ENV_SOCKET} right?")
