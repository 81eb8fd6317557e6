"""Shared fixtures: a one-rank gloo world for DeepSpeed engines built in the test process, and a
free port for the ``deepspeed`` launcher.

The world is module-scoped, torn down after each module, so other test directories can initialize
torch.distributed themselves. DeepSpeed's shared-memory comm op is never compiled.
"""

from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture
def master_port() -> str:
    """A port no one listens on now, for ``deepspeed --master_port``.

    The launcher's default (29500) is one fixed port: two launcher tests at once (pytest-xdist
    workers, or another checkout's suite on the same machine) would meet in one rendezvous.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module")
def dist_world(tmp_path_factory):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed = pytest.importorskip("deepspeed")
    import torch.distributed as dist

    from perseus_demo.deepspeed_cpu import skip_shm_comm_op

    skip_shm_comm_op()
    store = tmp_path_factory.mktemp("gloo") / "store"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LOCAL_RANK", "0")  # PipelineModule reads it
        deepspeed.init_distributed("gloo", auto_mpi_discovery=False, init_method=f"file://{store}", rank=0, world_size=1)
        yield
    dist.destroy_process_group()
    import deepspeed.comm.comm as ds_comm

    ds_comm.cdb = None
