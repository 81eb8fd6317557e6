"""Real measured runs as ground truth: the Perseus artifact's A100 runs at many clock schedules.

``commands``: Merak's 1F1B command stream, which clock of a run is which forward or backward;
``runs``: a workload directory read and checked into typed values; ``table``: the measured
per-(stage, kind, clock) times with their spread and stalls; ``power``: one power curve per stage
and P_blocking, fitted on iteration energy; ``model``: those plus the constant non-compute time, as
a ``Profile`` the simulator and planner use; ``check``: every schedule predicted
leave-one-schedule-out and whether the model describes the workload; ``saving``: the best measured
saving and the project's planned one (planned with the non-compute time, as the runtime plans).
Pure computation (numpy, scipy).
"""

from perseus.measured.check import WorkloadCheck, leave_one_out
from perseus.measured.commands import Command, command_stream, instruction_clocks
from perseus.measured.model import MeasuredModel, Prediction, fit_model
from perseus.measured.power import PowerCurve, PowerFit, fit_power
from perseus.measured.runs import (
    RankRun,
    ScheduleRun,
    Workload,
    WorkloadShape,
    extract_archive,
    find_workload_dirs,
    parse_workload_name,
    read_workload,
)
from perseus.measured.saving import (Baseline, PlannedSaving, measured_baseline, measured_best_saving, model_frontier,
                                     planned_saving)
from perseus.measured.table import TimeEntry, TimeTable, build_time_table

__all__ = ["Baseline", "Command", "MeasuredModel", "PlannedSaving", "PowerCurve", "PowerFit", "Prediction",
           "RankRun", "ScheduleRun", "TimeEntry", "TimeTable", "Workload", "WorkloadCheck", "WorkloadShape",
           "build_time_table", "command_stream", "extract_archive", "find_workload_dirs", "fit_model", "fit_power",
           "instruction_clocks", "leave_one_out", "measured_baseline", "measured_best_saving",
           "model_frontier", "parse_workload_name", "planned_saving", "read_workload"]
