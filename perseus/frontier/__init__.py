"""The iteration time–energy frontier: the model (``model``), its version 2 file (``codec``), the
reader of version 1 files (``v1``) and each iteration's non-compute time (``non_compute``). Import
from here: ``Frontier``, ``load_frontier``, ``save_frontier``, ``NonCompute``."""

from perseus.frontier.codec import clock_table, encode_frontier_json, frontier_from_json_dict, load_frontier, save_frontier
from perseus.frontier.model import Frontier, FrontierPoint, thin_points
from perseus.frontier.non_compute import NO_NON_COMPUTE, NonCompute, from_measured_iteration

__all__ = ["NO_NON_COMPUTE", "Frontier", "FrontierPoint", "NonCompute", "clock_table", "encode_frontier_json",
           "from_measured_iteration", "frontier_from_json_dict", "load_frontier", "save_frontier", "thin_points"]
