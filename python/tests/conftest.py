"""Fixtures shared by the CPU tests."""

import json

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import ficco


@pytest.fixture
def world4():
    """A world-4 group in one process: PyTorch's fake backend."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.fixture
def gloo_job(tmp_path):
    """Runs ``worker(rank, port, out_dir, *args)`` in `world` processes (a
    gloo job on a free port; each rank writes ``out_dir/rank{r}.json``) and
    returns every rank's rows, by rank."""

    def run(worker, world, *args):
        port = ficco.free_port()
        mp.spawn(worker, args=(port, str(tmp_path), *args), nprocs=world)
        return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]

    return run
