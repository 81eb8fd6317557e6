"""torchrun entry of the toy pipeline, for elastic-restart tests.

``python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 1 toy_torchrun.py
CONFIG.json OUT_DIR``: every rank runs ``toy_pipeline.run_rank`` with ``env://``. Planning uses
the greedy stand-in planner, held back 3 s in the first attempt so that a rank can die while rank 0
is still planning.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from toy_helpers import greedy_frontier_held_back_in_first_attempt
from toy_pipeline import ToyConfig, run_rank

from perseus.runtime.supply import planning


def main() -> None:
    cfg = ToyConfig(**json.loads(Path(sys.argv[1]).read_text()))
    planning.plan_frontier = greedy_frontier_held_back_in_first_attempt  # imported by name in the planner process
    run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg, sys.argv[2], "")


if __name__ == "__main__":
    main()
