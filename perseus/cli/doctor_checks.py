"""``perseus doctor``'s checks: each reads one fact about this node and never changes it.

NVML is reached only through ``ReadOnlyNVML`` (every set/reset call refused before the driver), the
clock daemons only by a connect or a discovery GET, claims only by reading ``/proc/locks``, and
framework versions only from package metadata: a doctor run must leave clocks, power limits, modes
and other jobs' claims exactly as it found them.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"
_MIG_ENABLE = 1
_APPLICATIONS_CLOCKS = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting
_PERIOD_POLL_S = 0.5


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, how it stands, what it found, and the fix."""

    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class GPUFacts:
    """What doctor read from one visible GPU (``None``: NVML could not tell)."""

    cuda_index: int
    index: int
    uuid: str
    name: str
    mig: bool = False
    clock_locked: bool | None = None
    power_limit_w: float | None = None
    power_limit_range_w: tuple[float, float] | None = None
    energy_counter_period_s: float | None = None
    claimed_by: str | None = None  # who holds this GPU's Perseus claim, where someone does

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NodeFacts:
    """Everything the mode decision needs, gathered by ``gather``."""

    simulated: bool = False
    nvml: bool = False
    driver: str | None = None
    gpus: list[GPUFacts] = field(default_factory=list)
    cap_sys_admin: bool = False
    euid: int = -1
    clockd: str | None = None  # socket path where $PERSEUS_CLOCKD_SOCKET is set
    clockd_problem: str | None = None
    zeusd: str | None = None
    zeusd_problem: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def add(self, check: str, status: str, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(check, status, detail, fix))


def gather(*, quick: bool) -> NodeFacts:
    """Every check, in report order; ``quick`` skips the energy-counter measurement and torch's import."""
    from perseus.gpu.factory import ENV_KIND

    facts = NodeFacts()
    facts.simulated = os.environ.get(ENV_KIND, "").strip().lower() == "sim"
    if facts.simulated:
        from perseus.gpu.sim.state import default_state_dir

        facts.add("simulated GPU", OK, f"PERSEUS_GPU=sim: the simulated GPU stands in for NVML (state in "
                  f"{default_state_dir()}); no real clock changes", "unset PERSEUS_GPU to use the real GPUs")
    check_nvml(facts, quick=quick)
    check_privileges(facts)
    check_clockd(facts)
    check_zeusd(facts)
    check_claims(facts)
    check_versions(facts, quick=quick)
    return facts


def check_nvml(facts: NodeFacts, *, quick: bool) -> None:
    """NVML importable and initialised, then each visible GPU's facts (getters only)."""
    from perseus.gpu.errors import GPUError, LIBRARY_HINT
    from perseus.gpu.nvml.device import BINDING_FIX, NVMLBindingMissingError, load_pynvml, translate_nvml_error
    from perseus.gpu.nvml.readonly import ReadOnlyNVML

    bad = WARN if facts.simulated else FAIL
    try:
        nv = ReadOnlyNVML(load_pynvml())
        nv.nvmlInit()
    except NVMLBindingMissingError as exc:
        facts.add("NVML", bad, exc.what, f"{BINDING_FIX} (or PERSEUS_GPU=sim for the simulated GPU)")
        return
    except GPUError as exc:
        facts.add("NVML", bad, " ".join(str(exc).split()), LIBRARY_HINT)
        return
    except Exception as exc:  # noqa: BLE001 - pynvml's NVMLError, whatever its class
        facts.add("NVML", bad, str(translate_nvml_error(exc, "Initializing NVML")).split(". ")[0], LIBRARY_HINT)
        return
    try:
        facts.nvml = True
        facts.driver = _text(_get(nv, "nvmlSystemGetDriverVersion")) or "unknown"
        cuda = _get(nv, "nvmlSystemGetCudaDriverVersion")
        cuda_text = f", CUDA {int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda else ""
        facts.add("NVML", OK, f"driver {facts.driver}{cuda_text}")
        try:
            _visible_gpus(nv, facts)
        except Exception as exc:  # noqa: BLE001 - e.g. a GPU lost while enumerating: a finding, not a crash
            facts.add("GPUs", bad, f"enumerating the GPUs failed ({exc})", "check `nvidia-smi`; a lost GPU needs a reset")
        if facts.gpus and not quick:
            _counter_periods(nv, facts.gpus)
        for gpu in facts.gpus:
            _gpu_findings(facts, gpu, quick=quick)
    finally:
        nv.nvmlShutdown()


def _get(nv: Any, name: str, *args: Any) -> Any:
    """A getter's value, or None where the binding, GPU or driver lacks it."""
    try:
        return getattr(nv, name)(*args)
    except Exception:  # noqa: BLE001 - a missing getter is "unknown", never a crash
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else ("" if value is None else str(value))


def _visible_gpus(nv: Any, facts: NodeFacts) -> None:
    """The GPUs CUDA_VISIBLE_DEVICES leaves this process, mapped to NVML devices by UUID."""
    from perseus.gpu.errors import GPUError
    from perseus.gpu.nvml.cuda_visible import parse_cuda_visible_devices, resolve_physical_index

    count = int(_get(nv, "nvmlDeviceGetCount") or 0)
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
    visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    for cuda_index in range(count if visible is None else len(visible)):
        try:
            index = resolve_physical_index(cuda_index, visible, uuids)
        except GPUError as exc:
            facts.add(f"GPU cuda:{cuda_index}", FAIL, " ".join(str(exc).split()),
                      "make CUDA_VISIBLE_DEVICES name whole GPUs (indices or GPU- UUIDs)")
            continue
        h = handles[index]
        mig = _get(nv, "nvmlDeviceGetMigMode", h)
        limit = _get(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
        limits = _get(nv, "nvmlDeviceGetPowerManagementLimitConstraints", h)
        reasons = _get(nv, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = _get(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        facts.gpus.append(GPUFacts(
            cuda_index, index, uuids[index], _text(_get(nv, "nvmlDeviceGetName", h)) or "unknown",
            mig=bool(mig is not None and int(mig[0]) == _MIG_ENABLE),
            clock_locked=None if reasons is None else bool(int(reasons) & _APPLICATIONS_CLOCKS),
            power_limit_w=None if limit is None else int(limit) / 1000.0,
            power_limit_range_w=None if limits is None else (int(limits[0]) / 1000.0, int(limits[1]) / 1000.0),
        ))
    if not facts.gpus:
        facts.add("GPUs", FAIL if not facts.simulated else WARN, f"NVML sees {count} GPU(s), none visible to this process",
                  "check CUDA_VISIBLE_DEVICES and the job's GPU allocation")


def _counter_periods(nv: Any, gpus: list[GPUFacts]) -> None:
    """Poll every GPU's energy counter for half a second at once: its median update period."""
    from perseus.gpu.meter.energy import CounterUpdate, counter_period_s

    handles = [nv.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
    updates: list[list[CounterUpdate]] = [[] for _ in gpus]
    last: list[Any] = [None for _ in gpus]
    end = time.monotonic() + _PERIOD_POLL_S
    while time.monotonic() < end:
        for i, h in enumerate(handles):
            value = _get(nv, "nvmlDeviceGetTotalEnergyConsumption", h)
            now = time.monotonic()
            if value is not None and last[i] is not None and value != last[i]:
                updates[i].append(CounterUpdate(now, float(value) / 1000.0))
            last[i] = value
        time.sleep(0.001)
    for gpu, ups in zip(gpus, updates):
        gpu.energy_counter_period_s = counter_period_s(ups)


def _gpu_findings(facts: NodeFacts, gpu: GPUFacts, *, quick: bool) -> None:
    what = f"GPU cuda:{gpu.cuda_index}"
    facts.add(what, OK, f"{gpu.name} (NVML index {gpu.index}, {gpu.uuid})")
    if gpu.mig:
        facts.add(f"{what} MIG", WARN, "MIG mode is enabled: a clock change would change every MIG instance's "
                  "clock, so Perseus measures only there",
                  f"disable MIG (`sudo nvidia-smi -i {gpu.index} -mig 0`), or accept measure-only")
    else:
        facts.add(f"{what} MIG", OK, "MIG mode off")
    if gpu.power_limit_w is None:
        facts.add(f"{what} power limit", WARN, "NVML does not report the power limit", "")
    else:
        lo_hi = gpu.power_limit_range_w
        rng = f" (range {lo_hi[0]:g}-{lo_hi[1]:g} W)" if lo_hi else ""
        facts.add(f"{what} power limit", OK, f"{gpu.power_limit_w:g} W{rng}")
    period = gpu.energy_counter_period_s
    if quick:
        facts.add(f"{what} energy counter", OK, "period not measured (--quick)")
    elif period is None:
        facts.add(f"{what} energy counter", WARN, f"period not measured: the counter changed fewer than 3 times "
                  f"in {_PERIOD_POLL_S:g} s (an idle GPU's counter may be that slow, or it is unsupported)",
                  "rerun while the GPU is busy, or ignore on pre-Volta GPUs (power is integrated instead)")
    else:
        facts.add(f"{what} energy counter", OK, f"updates every {period * 1000:.0f} ms")
    if gpu.clock_locked:
        facts.add(f"{what} clock lock", WARN, "the SM clock is already locked (the applications-clocks event "
                  "reason is set): Perseus leaves someone else's lock alone and changes no clock",
                  f"if the lock is stale, `sudo nvidia-smi -i {gpu.index} -rgc` resets it")
    else:
        facts.add(f"{what} clock lock", OK, "no lock seen" if gpu.clock_locked is False
                  else "unknown (NVML reports no clock-event reasons); a lock at the default clock never shows")


def check_privileges(facts: NodeFacts) -> None:
    """The effective capability decides clock access, not the uid."""
    from perseus.gpu.nvml.device import has_cap_sys_admin, in_user_namespace

    facts.cap_sys_admin, facts.euid = has_cap_sys_admin(), os.geteuid()
    if facts.cap_sys_admin:
        facts.add("privileges", OK, f"euid {facts.euid} with CAP_SYS_ADMIN: this process may change clocks")
    elif facts.euid == 0 and in_user_namespace():
        facts.add("privileges", WARN, "root in a user namespace (a remapped container): its capabilities hold only "
                  "inside it, and NVML refuses its clock changes",
                  "use perseus clockd on the node with its socket mounted, or zeusd (docs/clock-access.md); or run "
                  "the container without remapping root and with CAP_SYS_ADMIN")
    elif facts.euid == 0:
        facts.add("privileges", WARN, "root without CAP_SYS_ADMIN (a container's default capabilities): NVML refuses "
                  "its clock changes", "grant CAP_SYS_ADMIN (`docker run --cap-add SYS_ADMIN`; Kubernetes "
                  "securityContext.capabilities.add: [SYS_ADMIN]), or use perseus clockd or zeusd (docs/gpu.md)")
    else:
        facts.add("privileges", WARN, f"euid {facts.euid} without CAP_SYS_ADMIN: changing clocks locally is not "
                  "probed (a probe would lock a clock); NVML normally refuses it",
                  "run perseus clockd on the node (PERSEUS_CLOCKD_SOCKET) or zeusd (PERSEUS_ZEUSD_SOCKET), "
                  "or grant CAP_SYS_ADMIN")


def check_clockd(facts: NodeFacts) -> None:
    """The socket exists and accepts a connection, closed at once: no HELLO, so nothing is claimed."""
    from perseus.gpu.clockd.client import ENV_SOCKET, clockd_socket_from_env

    facts.clockd = clockd_socket_from_env()
    if facts.clockd is None:
        facts.add("clockd", OK, f"not configured ({ENV_SOCKET} unset)")
        return
    facts.clockd_problem = _socket_problem(facts.clockd)
    if facts.clockd_problem is None:
        facts.add("clockd", OK, f"{facts.clockd} accepts connections")
    else:
        facts.add("clockd", FAIL, f"{facts.clockd}: {facts.clockd_problem}",
                  f"start `perseus clockd --socket {facts.clockd}` on this node, or fix or unset {ENV_SOCKET}")


def _socket_problem(path: str) -> str | None:
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return "not a socket"
    except OSError as exc:
        return exc.strerror or str(exc)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        return f"connection failed ({exc.strerror or exc})"
    finally:
        sock.close()
    return None


def check_zeusd(facts: NodeFacts) -> None:
    """zeusd's discovery route (a GET), and whether it would let this process change each GPU's clocks."""
    from perseus.gpu.errors import GPUError
    from perseus.gpu.zeusd.client import ENV_SOCKET, ZeusdClient, zeusd_socket_from_env

    facts.zeusd = zeusd_socket_from_env()
    if facts.zeusd is None:
        facts.add("zeusd", OK, f"not configured ({ENV_SOCKET} unset)")
        return
    try:
        client = ZeusdClient(facts.zeusd, timeout_s=3.0)
        try:
            ids = [g.index for g in facts.gpus] or client.gpu_ids(client.discover())[:1]
            problems = [p for p in (client.control_problem(i) for i in ids) if p]
        finally:
            client.close()
    except GPUError as exc:
        problems = [" ".join(str(exc).split())]
    facts.zeusd_problem = "; ".join(problems) or None
    if facts.zeusd_problem is None:
        facts.add("zeusd", OK, f"{facts.zeusd} answers and allows gpu-control")
    else:
        facts.add("zeusd", FAIL, facts.zeusd_problem, f"start zeusd on this node, or fix or unset {ENV_SOCKET}")
    if facts.clockd is not None:
        facts.add("clock service", FAIL, "both PERSEUS_CLOCKD_SOCKET and PERSEUS_ZEUSD_SOCKET are set: Perseus "
                  "stops at start-up", "unset one of them")


def check_claims(facts: NodeFacts) -> None:
    """The claim directory usable, and which visible GPU another Perseus process claims (read from
    ``/proc/locks``: taking the lock, even briefly, could push a starting job into measure-only)."""
    from perseus.gpu.control.claim import ENV_CLAIM_DIR, claim_dir

    d = claim_dir()
    probe = next((p for p in (d, *d.parents) if p.exists()), Path("/"))
    if os.access(probe, os.W_OK | os.X_OK):
        facts.add("claim directory", OK, f"{d} {'writable' if probe == d else 'can be created'}")
    else:
        facts.add("claim directory", WARN, f"{d} is not writable: a second Perseus process changing the same "
                  "GPU's clocks would not be noticed", f"point {ENV_CLAIM_DIR} at a writable directory (one host "
                  "directory shared by every container on the node)")
    locks = _flock_inodes()
    for gpu in facts.gpus:
        path = d / f"{gpu.uuid}.claim"
        try:
            ino = path.stat().st_ino
        except OSError:
            continue
        if ino in locks:
            gpu.claimed_by = f"pid {_read_pid(path) or locks[ino]}"
            facts.add(f"GPU cuda:{gpu.cuda_index} claim", WARN, f"claimed by another Perseus process "
                      f"({gpu.claimed_by}, {path}): this one would change none of its clocks",
                      "give each Perseus process a GPU of its own")


def _flock_inodes() -> dict[int, str]:
    """Inode → holder pid of every ``flock`` in ``/proc/locks``."""
    held: dict[int, str] = {}
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return held
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].count(":") == 2:  # "->": a waiter
            held[int(parts[5].rsplit(":", 1)[1])] = parts[4]
    return held


def _read_pid(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text if text.isdigit() else None


_FRAMEWORKS = ("megatron-core", "deepspeed", "torchtitan", "nvidia-ml-py", "httpx")


def check_versions(facts: NodeFacts, *, quick: bool) -> None:
    """torch (imported for CUDA availability unless ``quick``) and the frameworks, from metadata only."""
    torch = _version("torch")
    if torch is None:
        facts.add("torch", WARN, "not installed", "pip install torch (the adapters need it; planning does not)")
    elif quick:
        facts.add("torch", OK, f"{torch} (CUDA not checked: --quick)")
    else:
        try:
            import torch as t

            cuda = t.cuda.is_available()
            facts.add("torch", OK if cuda or facts.simulated else WARN,
                      f"{torch}, CUDA {t.version.cuda or 'none'}, {'a' if cuda else 'no'} CUDA device available",
                      "" if cuda else "install a CUDA build of torch matching the driver")
        except Exception as exc:  # noqa: BLE001 - a broken torch is a finding, not a crash
            facts.add("torch", WARN, f"{torch} does not import ({exc})", "reinstall torch")
    found = [f"{name} {v}" for name, v in ((n, _version(n)) for n in _FRAMEWORKS) if v]
    facts.add("frameworks", OK, ", ".join(found) or "none of " + ", ".join(_FRAMEWORKS) + " installed")
    check_supported_versions(facts)


def check_supported_versions(facts: NodeFacts) -> None:
    """The installed torch, megatron-core and deepspeed against perseus/versions.py's table."""
    from perseus import versions

    installed = {row.package: _version(row.package) for row in versions.SUPPORTED}
    problems = [p for p in (versions.problem(name, v) for name, v in installed.items() if v) if p]
    if problems:
        facts.add("supported versions", WARN, "; ".join(problems),
                  "the adapters run where their hook points are found; see docs/install.md for the tested releases")
    else:
        present = [f"{name} {v}" for name, v in installed.items() if v]
        facts.add("supported versions", OK, (", ".join(present) + ": supported") if present
                  else "no framework installed (planning and the CLI need none)")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
