"""Fixtures shared by the CPU tests."""

import pytest
import torch.distributed as dist


@pytest.fixture
def world4():
    """A world-4 group in one process: PyTorch's fake backend."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()
