"""The one place the runtime's control plane is chosen: hierarchical along the job's grid
(the default), or one flat gloo group (``control_plane: flat``, or a group the caller passes).
"""

from __future__ import annotations

import logging
from typing import Any

from perseus.runtime.config import DESIGNS, ControlPlaneDesign
from perseus.runtime.plane.collective import Collective, dist
from perseus.runtime.job import PipelineJob

log = logging.getLogger("perseus.runtime")


def open_control_plane(job: PipelineJob, process_group: Any = None, timeout_s: float | None = None,
                       design: ControlPlaneDesign | str = ControlPlaneDesign.HIERARCHICAL) -> Collective:
    """Every rank of the job calls this at the same point (it connects to peers).

    Flat where the hierarchy cannot apply: no torch.distributed or one process (the local
    plane), a group given by the caller (its ranks are the job), or a job description that does
    not cover the world (``dp × stages × tp`` ≠ world size: ranks Perseus does not see)."""
    if design not in DESIGNS:
        raise ValueError(f"control_plane must be one of {DESIGNS}, not {design!r}")
    if design == ControlPlaneDesign.FLAT or process_group is not None or dist is None or not dist.is_available() \
            or not dist.is_initialized() or dist.get_world_size() == 1:
        return Collective(process_group, timeout_s)
    world = dist.get_world_size()
    covered = job.dp_size * job.num_stages * job.tp_size
    if covered != world:
        if dist.get_rank() == 0:
            log.warning("perseus: the job description covers %d ranks (dp %d × stages %d × tp %d) of %d; using the flat "
                        "control plane (one gloo group over all ranks)", covered, job.dp_size, job.num_stages,
                        job.tp_size, world)
        return Collective(process_group, timeout_s)
    from perseus.runtime.plane.hierarchy import HierarchicalCollective

    return HierarchicalCollective(job, timeout_s)
