"""The CPU harness redirects exactly the CUDA assumptions megatron-core's schedules make."""

from __future__ import annotations

import pytest
import torch

from perseus_demo.megatron_cpu import cpu_execution

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU harness refuses to run next to a GPU")


def test_cuda_devices_become_cpu_inside_and_torch_cuda_is_restored_after():
    current, sync = torch.cuda.current_device, torch.cuda.synchronize
    with cpu_execution():
        tensors = [
            torch.zeros([], dtype=torch.int, device="cuda"),  # the schedules' token counter
            torch.empty((3,), device=torch.cuda.current_device(), dtype=torch.int64),  # p2p receive buffers
            torch.ones(2, device=torch.device("cuda", 0)),
            torch.ones(2).cuda(),
            torch.ones(2).to("cuda:0"),
        ]
        torch.cuda.synchronize()  # after batched p2p: a no-op here
    assert all(t.device.type == "cpu" for t in tensors)
    assert (torch.cuda.current_device, torch.cuda.synchronize) == (current, sync)
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")  # outside the block CUDA is CUDA again
