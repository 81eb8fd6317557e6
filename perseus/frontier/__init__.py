"""The iteration time–energy frontier: the model (``model``), its version 2 file (``codec``) and
the reader of version 1 files (``v1``). Import from here: ``Frontier``, ``load_frontier``,
``save_frontier``."""

from perseus.frontier.codec import clock_table, encode_frontier_json, frontier_from_json_dict, load_frontier, save_frontier
from perseus.frontier.model import Frontier, FrontierPoint, thin_points

__all__ = ["Frontier", "FrontierPoint", "clock_table", "encode_frontier_json", "frontier_from_json_dict", "load_frontier",
           "save_frontier", "thin_points"]
