"""``perseus doctor``: can Perseus work on this node, and in which mode; it changes nothing.

Each finding is one line (OK / WARN / FAIL, what, the fix). The mode is decided from the same facts
the runtime's ``open_clock_service`` acts on (privileges, MIG, claims, a lock in force, clockd and
zeusd), without its lock-and-reset probe: where only that probe could tell, doctor says so.

Exit status: 0 run mode can work here (clocks can change: CAP_SYS_ADMIN, a reachable clockd or zeusd,
or the simulated GPU with ``PERSEUS_GPU=sim``); 1 Perseus would run measure-only; 2 it cannot run
(no NVML or no visible GPU, and no simulated GPU; or both clock services configured).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from perseus.cli.common import Command

if TYPE_CHECKING:
    from perseus.cli.doctor_checks import NodeFacts

RUN, MEASURE_ONLY, UNAVAILABLE = "run", "measure-only", "unavailable"
EXIT_CODES = {RUN: 0, MEASURE_ONLY: 1, UNAVAILABLE: 2}
_MEASURE_NOTE = ('without_clock_access: measure-only (the default) trains on, measuring without changing a '
                 'clock; "fail" stops the job instead')


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object: mode, findings, gpus")
    p.add_argument("--quick", action="store_true",
                   help="skip the 0.5 s energy-counter measurement and torch's import")


def decide_mode(facts: NodeFacts) -> tuple[str, str, str]:
    """(mode, why, fix) from the facts alone, in the runtime's order: the clock service, then MIG,
    then claims and locks in force, then this process's own privileges."""
    if facts.clockd is not None and facts.zeusd is not None:
        return UNAVAILABLE, "both perseus clockd and zeusd are configured", "unset PERSEUS_CLOCKD_SOCKET or PERSEUS_ZEUSD_SOCKET"
    if not facts.simulated and not facts.gpus:
        why = "no visible GPU" if facts.nvml else "NVML is unavailable"
        return UNAVAILABLE, f"{why} and no simulated GPU", 'install the NVIDIA driver and `pip install "perseus-energy[gpu]"`, or PERSEUS_GPU=sim'
    mig = [g for g in facts.gpus if g.mig] if not facts.simulated else []
    if mig:
        return (MEASURE_ONLY, f"MIG mode is enabled on GPU {', '.join(str(g.index) for g in mig)}",
                f"disable MIG (`sudo nvidia-smi -i {mig[0].index} -mig 0`)")
    if facts.clockd is not None:
        if facts.clockd_problem is not None:
            return MEASURE_ONLY, f"perseus clockd is not reachable ({facts.clockd_problem})", "start perseus clockd"
        return RUN, f"perseus clockd at {facts.clockd} changes the clocks (its allowlist decides per user)", ""
    if facts.zeusd is not None and facts.zeusd_problem is not None:
        return MEASURE_ONLY, f"zeusd would not change the clocks ({facts.zeusd_problem})", "fix zeusd or its token"
    claimed = [g for g in facts.gpus if g.claimed_by]
    if claimed:
        return (MEASURE_ONLY, f"GPU {claimed[0].index} is claimed by another Perseus process ({claimed[0].claimed_by})",
                "give each Perseus process a GPU of its own")
    locked = [g for g in facts.gpus if g.clock_locked and not facts.simulated]
    if locked:
        return (MEASURE_ONLY, f"the SM clock of GPU {locked[0].index} is already locked by someone else",
                f"`sudo nvidia-smi -i {locked[0].index} -rgc` if the lock is stale")
    if facts.simulated:
        return RUN, "the simulated GPU (PERSEUS_GPU=sim) lets this process change its clocks", ""
    if facts.zeusd is not None:
        return RUN, f"zeusd at {facts.zeusd} changes the clocks", ""
    if facts.cap_sys_admin:
        return RUN, "this process holds CAP_SYS_ADMIN", ""
    if facts.euid == 0:
        return (MEASURE_ONLY, "root without CAP_SYS_ADMIN (a user-namespaced container)",
                "grant CAP_SYS_ADMIN (docker --cap-add SYS_ADMIN; Kubernetes securityContext.capabilities.add: "
                "[SYS_ADMIN]), or use perseus clockd or zeusd")
    return (MEASURE_ONLY, "no CAP_SYS_ADMIN, and no clockd or zeusd configured (a local lock was not probed: the "
            "probe locks a clock)", "run perseus clockd (PERSEUS_CLOCKD_SOCKET) or zeusd, or grant CAP_SYS_ADMIN")


def run(args: argparse.Namespace) -> int:
    from perseus.cli.doctor_checks import FAIL, OK, WARN, gather

    facts = gather(quick=args.quick)
    mode, why, fix = decide_mode(facts)
    if mode == MEASURE_ONLY:
        why = f"{why}; {_MEASURE_NOTE}"
    status = {RUN: OK, MEASURE_ONLY: WARN, UNAVAILABLE: FAIL}[mode]
    facts.add("mode", status, f"{mode}: {why}", fix)
    if args.json:
        print(json.dumps({"mode": mode, "why": why, "exit_code": EXIT_CODES[mode],
                          "findings": [vars(f) for f in facts.findings],
                          "gpus": [g.as_json() for g in facts.gpus]}, indent=2))
    else:
        width = max(len(f.check) for f in facts.findings)
        for f in facts.findings:
            print(f"{f.status:<4}  {f.check:<{width}}  {f.detail}" + (f"  -> fix: {f.fix}" if f.fix else ""))
    return EXIT_CODES[mode]


COMMAND = Command("doctor", help="which mode Perseus runs in here, and why (changes nothing)",
                  description="Check this node read-only (GPU, driver, NVML, MIG, power limit, energy counter, "
                              "privileges, clockd / zeusd, claims, torch and framework versions) and say which "
                              "mode Perseus would run in, one line per finding with its fix. It never changes a "
                              "clock, a power limit or a mode.",
                  add_arguments=add_arguments, run=run,
                  epilog="exit status: 0 run mode works here; 1 measure-only; 2 Perseus cannot run "
                         "(no GPU and no simulated GPU)\n\n"
                         "examples:\n  perseus doctor\n  perseus doctor --json --quick")
