"""Which modules of tests/megatron the second release line runs again (read by conftest.py).

``scripts/megatron_py312.sh`` (part of ``scripts/test_all.sh``) runs tests/megatron a second time
on Python 3.12 with megatron-core 0.19.x, to prove that release line works: the hooks on its real
schedules, the real ``pretrain_gpt.py`` of its generation, its patches, the orders and the demo
runs on it. A module whose checks do not depend on which megatron-core is installed proves nothing
more there, so it runs once, on the suite's own line; ``RUN_ONCE`` names each with the reason.
Its tests get the ``megatron_line_independent`` marker and the 3.12 line deselects them
(``-m "not megatron_line_independent"``). Any module not listed, a new one included, runs on both.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = "megatron_line_independent"

RUN_ONCE = {
    "test_megatron_args.py": "the --perseus flags on a plain argparse parser; no megatron-core",
    "test_megatron_cpu.py": "torch.cuda redirection by the CPU harness, checked on torch alone",
    "test_megatron_dag_edges.py": "Perseus' DAG against a model of megatron's exchanges; no megatron-core",
    "test_megatron_dp_straggler.py": "the straggler policy across data-parallel replicas: megatron-core is only "
                                     "its workload (its 1F1B deployment on 0.19 is test_megatron_lm_pretrain_gpt's)",
    "test_megatron_line_selection.py": "checks this list",
    "test_megatron_launcher.py": "the launcher on fake checkouts of both generations (the real 0.19 checkout "
                                 "runs in test_megatron_lm_pretrain_gpt.py)",
    "test_megatron_lm_demo_cli.py": "perseus demo --megatron-lm wiring, with the run replaced",
    "test_megatron_patcher.py": "the patcher edits text: every release's files are read from their archives, "
                                "so one interpreter checks all four",
    "test_megatron_schedule_oracle.py": "both releases' oracles are read from their archives with ast, so one "
                                        "interpreter checks 0.16.1 and 0.19.0",
    "test_megatron_switch_latency.py": "the runtime's switch-latency hiding; megatron-core is only its workload",
    "test_megatron_tracker.py": "ScheduleTracker on plain objects",
    "test_megatron_versions.py": "both releases' schedules.py read from their archives",
}

