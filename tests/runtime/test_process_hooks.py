"""The process's hooks belong to its entry point: building a ``PerseusRuntime`` installs no
``sys.excepthook``, signal handler or ``atexit`` hook; ``install_process_hooks`` (through an
adapter's ``entry_point_hooks``) does, unless the config leaves them to the trainer. That the
clocks are reset on every exit path with the hooks is tested in test_toy_distributed.py
(exception, SIGTERM) and without them in tests/gpu/control/test_gpu_controller.py (the controller's own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STATE = """
import atexit, json, signal, sys
def state():
    return [sys.excepthook is sys.__excepthook__, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
            atexit._ncallbacks()]
"""

RUNTIME = STATE + """
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
before = state()
config = PerseusConfig.from_dict({"gpu": "sim", "mode": "measure-only", "cache_dir": None, "log_every_steps": 0,
                                  "warmup_steps": 1})
with PerseusRuntime(PipelineJob(num_stages=1, num_microbatches=2, stage=0), config) as runtime:
    during = state()
print(json.dumps([before, during]))
"""

ENTRY = STATE + """
from perseus.runtime import PerseusConfig, entry_point_hooks
before = state()
entry_point_hooks(PerseusConfig.from_dict(json.loads(sys.argv[1])))
print(json.dumps([before, state()]))
"""


def _run(code: str, tmp_path: Path, *args: str) -> list[list]:
    env = {"PYTHONPATH": str(ROOT), "PERSEUS_SIM_GPU_DIR": str(tmp_path / "sim"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_runtime_installs_nothing_process_wide(tmp_path):
    before, during = _run(RUNTIME, tmp_path)
    assert before[:2] == [True, True] and during == before


@pytest.mark.parametrize("section, installs", [({}, True), ({"process_hooks": False}, False),
                                               ({"enabled": False}, False)])
def test_the_entry_point_installs_the_hooks_unless_the_config_leaves_them_to_the_trainer(tmp_path, section, installs):
    before, after = _run(ENTRY, tmp_path, json.dumps(section))
    assert before[:2] == [True, True]
    if installs:
        assert after[:2] == [False, False] and after[2] > before[2]  # excepthook, SIGTERM, atexit
    else:
        assert after == before


def test_the_torch_adapter_calls_the_entry_point_hooks_before_the_runtime(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import perseus_torch.integration as integration
    from perseus.runtime import PerseusConfig, RecordingListener

    calls: list[str] = []
    monkeypatch.setattr(integration, "entry_point_hooks", lambda config: calls.append(f"hooks {config.process_hooks}"))

    class Runtime(RecordingListener):
        def __init__(self, job: object, config: PerseusConfig, *, process_group: object = None) -> None:
            super().__init__()
            calls.append("runtime")

        def close(self) -> None:
            pass

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
        schedule = Schedule1F1B(stage, 2, loss_fn=lambda out, target: out.sum())
        integration.enable(schedule, stage, {"process_hooks": False}, runtime_factory=Runtime).close()
    finally:
        dist.destroy_process_group()
    assert calls == ["hooks False", "runtime"]


def test_an_uncaught_error_reaches_a_stderr_shared_by_ranks_as_one_write(monkeypatch):
    """``print`` writes a line and its newline apart; on a launcher's pipe that every rank writes
    to, another rank's line landed between them (two ranks' errors on one line, seen in CI)."""
    from perseus.errors import ConfigError
    from perseus.runtime import lifecycle

    writes: list[str] = []

    class SharedStderr:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(lifecycle, "_ERRORS_HOOKED", False)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.delenv("PERSEUS_TRACEBACK", raising=False)
    lifecycle.one_line_errors()
    monkeypatch.setattr(sys, "stderr", SharedStderr())
    sys.excepthook(ConfigError, ConfigError("perseus: rank 1: no GPU"), None)
    assert len(writes) == 1 and writes[0].endswith("\n") and writes[0].count("\n") == 1, writes
    assert "rank 1: no GPU" in writes[0]
