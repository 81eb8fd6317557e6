"""Prometheus exporter: Perseus's state as metrics on a local HTTP endpoint.

Optional (``pip install -e '.[prometheus]'``). A ``PrometheusExporter`` owns its own
``CollectorRegistry`` (nothing lands in the process-wide default registry) and serves it on
``addr:port``; port 0 picks a free port, reported as ``exporter.port``. ``addr`` is 127.0.0.1 unless
given (the config's ``prometheus_addr``): the endpoint has no authentication, so only the host it runs
on reaches it; ``0.0.0.0`` (every IPv4 interface), ``::`` (every interface) or the node's own address
lets a cluster's Prometheus scrape it. It is updated at most once per training iteration from a plain
snapshot dict, never from the per-instruction hot path::

    exporter = PrometheusExporter(port=9400)
    exporter.update({"phase": "deployed", "clock_mhz": 1200, "energy_total_j": {"0": 1234.5},
                     "instructions_total": {1410: 96, 1200: 160}, "point_slowdown": 1.0,
                     "point_energy_j": 101.1, "straggler_ratio": 1.0, "energy_saving": 0.093})
    ...
    exporter.close()

Snapshot keys (all optional; a key left out leaves its metric as it was):

- ``phase``: the runtime phase now (``perseus_phase{phase}`` is 1 for it, 0 for the others).
- ``clock_mhz``: SM clock of this GPU now (``perseus_clock_mhz``).
- ``energy_total_j``: cumulative energy per GPU since any fixed origin, ``{gpu: J}``; the
  counter ``perseus_energy_joules_total{gpu}`` grows by the increase since the last snapshot (a
  lower value means the source restarted: counting continues from it).
- ``instructions_total``: cumulative instructions run per clock, ``{clock_mhz: count}``; the
  counter ``perseus_instructions_total{clock_mhz}`` grows the same way.
- ``point_slowdown``, ``point_energy_j``: the deployed frontier point's planned iteration time
  over the no-slowdown point's, and its planned iteration energy in J.
- ``straggler_ratio``: slowdown the straggler policy follows (1 = none).
- ``energy_saving``: fraction of energy saved against the baseline (0.09 = 9 %).
- ``energy_saved_total_j``: energy saved against the baseline so far, J (a gauge: it may fall).
- ``job_energy_per_iteration_j``: energy per iteration of all GPUs of the job, J, as of the
  runtime's last periodic job check.
- ``carbon_intensity``, ``carbon_total_g``, ``job_power_w``, ``power_cap_w``: the grid's
  intensity (gCO2/kWh) in force, this GPU's carbon so far (g), the job's planned power at the
  point run and the cap (W) (docs/carbon.md).
- ``predicted_slowdown``, ``measured_slowdown``, ``predicted_energy_ratio``,
  ``measured_energy_ratio``: the deployed plan's predicted ratios to the probes' baseline and the
  same run's measured ones (``perseus_predicted_slowdown_ratio``, ...; observe/prediction.py).
- ``between_steps_s``, ``between_steps_energy_j``: the last step's GPU work between steps
  (optimizer, gradient all-reduce) and its energy (``perseus_between_steps_seconds``,
  ``perseus_between_steps_joules``).
- ``job_saving``, ``job_saving_low``, ``job_saving_high``: the job's energy saving against the
  default-clock probes, all GPUs, with its 95 % interval (``perseus_job_energy_saving_ratio``,
  ``perseus_job_energy_saving_low_ratio``, ``perseus_job_energy_saving_high_ratio``);
  ``job_plan_energy_j``, ``job_baseline_energy_j``: the job's energy per plan and per probe
  iteration (``perseus_job_plan_energy_joules``, ``perseus_job_baseline_energy_joules``).
- ``stage_energy_j``, ``stage_baseline_energy_j``, ``stage_saving``: ``{stage: value}``, each
  pipeline stage's energy per plan and per probe iteration over all its GPUs and its saving
  (``perseus_stage_energy_joules{stage}``, ``perseus_stage_baseline_energy_joules{stage}``,
  ``perseus_stage_energy_saving_ratio{stage}``; observe/job_saving.py).

A value of ``None`` also leaves its metric unchanged (e.g. no point deployed yet).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping

from perseus.errors import PerseusError

PHASES = ("warmup", "profiling", "planning", "deployed", "fallback", "steady")
SNAPSHOT_KEYS = frozenset({
    "phase", "clock_mhz", "energy_total_j", "instructions_total", "point_slowdown", "point_energy_j",
    "straggler_ratio", "energy_saving", "energy_saved_total_j", "job_energy_per_iteration_j",
    "carbon_intensity", "carbon_total_g", "job_power_w", "power_cap_w",
    "predicted_slowdown", "measured_slowdown", "predicted_energy_ratio", "measured_energy_ratio",
    "between_steps_s", "between_steps_energy_j",
    "job_saving", "job_saving_low", "job_saving_high", "job_plan_energy_j", "job_baseline_energy_j",
    "stage_energy_j", "stage_baseline_energy_j", "stage_saving",
})
INSTALL_HINT = "pip install -e '.[prometheus]'"


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise PerseusError(f"the Prometheus exporter needs prometheus-client: {INSTALL_HINT}") from None
    return prometheus_client


def _finite(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PerseusError(f"prometheus snapshot: {key} must be a finite number, got {value!r}")
    return float(value)


class PrometheusExporter:
    """Serves Perseus metrics on ``http://addr:port/metrics``; ``update`` once per step, ``close`` at the end."""

    def __init__(self, port: int = 0, addr: str = "127.0.0.1") -> None:
        client = _client()
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._energy = Counter("perseus_energy_joules", "GPU energy measured by Perseus (J)", ["gpu"], registry=r)
        self._instructions = Counter("perseus_instructions", "Instructions run, by the SM clock they ran at",
                                     ["clock_mhz"], registry=r)
        self._clock = Gauge("perseus_clock_mhz", "SM clock of this GPU now (MHz)", registry=r)
        self._phase = Gauge("perseus_phase", "Runtime phase: 1 for the current one, 0 for the others", ["phase"],
                            registry=r)
        self._slowdown = Gauge("perseus_deployed_point_slowdown",
                               "Planned iteration time of the deployed point over the no-slowdown point's (ratio)",
                               registry=r)
        self._point_energy = Gauge("perseus_deployed_point_energy_joules",
                                   "Planned iteration energy of the deployed point (J)", registry=r)
        self._straggler = Gauge("perseus_straggler_ratio", "Slowdown the straggler policy follows (1 = none)",
                                registry=r)
        self._saving = Gauge("perseus_energy_saving_ratio", "Fraction of energy saved against the baseline",
                             registry=r)
        self._saved = Gauge("perseus_energy_saved_joules", "Energy saved against the baseline so far (J)",
                            registry=r)
        self._job_energy = Gauge("perseus_job_energy_per_iteration_joules",
                                 "Energy per iteration of all GPUs of the job at the last job check (J)", registry=r)
        self._grid = {
            "carbon_intensity": Gauge("perseus_carbon_intensity_grams_per_kwh", "Grid carbon intensity in force "
                                      "(gCO2/kWh)", registry=r),
            "carbon_total_g": Gauge("perseus_carbon_grams", "Carbon of this GPU's energy so far (g)", registry=r),
            "job_power_w": Gauge("perseus_job_power_watts", "Planned power of the job at the point run (W)", registry=r),
            "power_cap_w": Gauge("perseus_power_cap_watts", "Job power cap in force (W)", registry=r),
        }
        self._prediction = {  # the deployed plan's prediction against the same run's probes (prediction.py)
            "predicted_slowdown": Gauge("perseus_predicted_slowdown_ratio", "Deployed point's planned time over the "
                                        "probes' baseline (ratio)", registry=r),
            "measured_slowdown": Gauge("perseus_measured_slowdown_ratio", "Median plan step time over median probe "
                                       "step time, same run (ratio)", registry=r),
            "predicted_energy_ratio": Gauge("perseus_predicted_energy_ratio", "Deployed point's planned energy over "
                                            "the probes' baseline (ratio)", registry=r),
            "measured_energy_ratio": Gauge("perseus_measured_energy_ratio", "Plan steps' energy over probes', "
                                           "same run (ratio)", registry=r),
        }
        self._between = {  # the last step's work between steps (metrics.BETWEEN_STEPS_FIELDS)
            "between_steps_s": Gauge("perseus_between_steps_seconds", "The last step's GPU work between steps "
                                     "(optimizer, gradient all-reduce) (s)", registry=r),
            "between_steps_energy_j": Gauge("perseus_between_steps_joules", "Energy of the last step's work "
                                            "between steps (J)", registry=r),
        }
        self._job_saving = {  # the job's saving against the probes (observe/job_saving.py)
            "job_saving": Gauge("perseus_job_energy_saving_ratio", "Energy saved by the whole job (all GPUs) against "
                                "its default-clock probe steps (fraction)", registry=r),
            "job_saving_low": Gauge("perseus_job_energy_saving_low_ratio", "Lower end of the job saving's 95 % "
                                    "interval (fraction)", registry=r),
            "job_saving_high": Gauge("perseus_job_energy_saving_high_ratio", "Upper end of the job saving's 95 % "
                                     "interval (fraction)", registry=r),
            "job_plan_energy_j": Gauge("perseus_job_plan_energy_joules", "Energy per plan iteration, all GPUs of "
                                       "the job (J)", registry=r),
            "job_baseline_energy_j": Gauge("perseus_job_baseline_energy_joules", "Energy per default-clock probe "
                                           "iteration, all GPUs of the job (J)", registry=r),
        }
        self._stages = {
            "stage_energy_j": Gauge("perseus_stage_energy_joules", "Energy per plan iteration of a pipeline stage, "
                                    "all its GPUs (J)", ["stage"], registry=r),
            "stage_baseline_energy_j": Gauge("perseus_stage_baseline_energy_joules", "Energy per default-clock "
                                             "probe iteration of a pipeline stage, all its GPUs (J)", ["stage"],
                                             registry=r),
            "stage_saving": Gauge("perseus_stage_energy_saving_ratio", "Energy saved by a pipeline stage against "
                                  "its default-clock probe steps (fraction)", ["stage"], registry=r),
        }
        for phase in PHASES:
            self._phase.labels(phase=phase).set(0)
        self._last_energy: dict[str, float] = {}
        self._last_count: dict[str, float] = {}
        self._known_phases = set(PHASES)
        self._lock = threading.Lock()
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise PerseusError(f"prometheus exporter: port must be 0..65535 (0 = pick a free one), got {port!r}")
        try:
            started = client.start_http_server(port, addr=addr, registry=r)
        except OSError as exc:
            raise PerseusError(f"prometheus exporter: cannot listen on {addr}:{port} ({exc.strerror or exc})") from None
        if not isinstance(started, tuple):  # prometheus-client < 0.20 returns nothing: no way to close it
            raise PerseusError(f"the Prometheus exporter needs prometheus-client >= 0.20: {INSTALL_HINT}")
        self._server, self._thread = started
        self.addr = addr
        self.port: int = self._server.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr  # an IPv6 address goes in brackets
        return f"http://{host}:{self.port}/metrics"

    def update(self, snapshot: Mapping[str, Any]) -> None:
        """Set every metric named in ``snapshot`` (see the module docstring for the keys)."""
        unknown = set(snapshot) - SNAPSHOT_KEYS
        if unknown:
            raise PerseusError(f"prometheus snapshot: unknown key(s) {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(sorted(SNAPSHOT_KEYS))}")
        with self._lock:
            phase = snapshot.get("phase")
            if phase is not None:
                self._known_phases.add(str(phase))
                for name in self._known_phases:
                    self._phase.labels(phase=name).set(1 if name == str(phase) else 0)
            self._counters(snapshot.get("energy_total_j"), "energy_total_j", self._energy, "gpu", self._last_energy)
            self._counters(snapshot.get("instructions_total"), "instructions_total", self._instructions, "clock_mhz",
                           self._last_count)
            for key, gauge in (("clock_mhz", self._clock), ("point_slowdown", self._slowdown),
                               ("point_energy_j", self._point_energy), ("straggler_ratio", self._straggler),
                               ("energy_saving", self._saving), ("energy_saved_total_j", self._saved),
                               ("job_energy_per_iteration_j", self._job_energy), *self._grid.items(),
                               *self._prediction.items(), *self._between.items(), *self._job_saving.items()):
                value = snapshot.get(key)
                if value is not None:
                    gauge.set(_finite(value, key))
            for key, gauge in self._stages.items():
                self._labelled(snapshot.get(key), key, gauge)

    @staticmethod
    def _labelled(values: Any, key: str, gauge: Any) -> None:
        """A gauge per stage from ``{stage: value}``."""
        if values is None:
            return
        if not isinstance(values, Mapping):
            raise PerseusError(f"prometheus snapshot: {key} must map a stage to a number, got {values!r}")
        for stage, value in values.items():
            gauge.labels(stage=str(stage)).set(_finite(value, f"{key}[{stage}]"))

    @staticmethod
    def _counters(totals: Any, key: str, counter: Any, label: str, last: dict[str, float]) -> None:
        if totals is None:
            return
        if not isinstance(totals, Mapping):
            raise PerseusError(f"prometheus snapshot: {key} must map {label} to a cumulative total, got {totals!r}")
        for name, total in totals.items():
            total = _finite(total, f"{key}[{name}]")
            name = str(name)
            previous = last.get(name)
            # First sight or a restarted source (lower total): count from its current value.
            increase = total if previous is None or total < previous else total - previous
            if increase > 0:
                counter.labels(**{label: name}).inc(increase)
            else:
                counter.labels(**{label: name})
            last[name] = total

    def close(self) -> None:
        """Stop serving and free the port; idempotent."""
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5)

    def __enter__(self) -> PrometheusExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
