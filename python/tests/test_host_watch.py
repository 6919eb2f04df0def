"""``auto``'s host watch, on the CPU: a group whose caller's stream is found
idle at most of its sampled calls on some rank turns its shapes to ``seq``
on every rank at the same call, unless their gain is large; calls under
capture, calls on a side stream, shapes already decided and groups that
never needed a gradient are not counted. Two gloo processes stand in for
the GPUs: the stream's idleness is scripted per rank, and the agreement is
a real all-reduce over the group."""

import json
import os

import torch
import torch.distributed as dist

import ficco.torch as ft

WORLD = 2
SHAPE = ("gemm-rs", 256, 128, 64)


def decision(gain_ms):
    return ft.Decision("shard-copy-ring", "shard-copy-ring", "predicted", 1.0, 1.0 - gain_ms, gain_ms, 0.02)


class Stream:
    def __init__(self, idle):
        self.idle = idle

    def query(self):
        return self.idle.pop(0)


def run_calls(group, idle, gain_ms, capturing=False, side=False, grad=True):
    """The schedule each of `len(idle) + HOST_SKIP` calls of SHAPE runs, the
    basis of its last decision, the watch's (samples, idle) and what a
    shape first called after them runs. `grad`: the group has made a call
    that needs a gradient."""
    ft._host_calls.clear()
    ft._host_group.clear()
    ft._decisions.clear()
    ft._grad_groups.clear()
    if grad:
        ft._grad_groups.add(group)
    ft._decisions[group] = {SHAPE: decision(gain_ms)}
    stream = Stream(list(idle))
    torch.cuda.current_stream = lambda device=None: stream
    torch.cuda.default_stream = lambda device=None: Stream([]) if side else stream
    torch.cuda.is_current_stream_capturing = lambda: capturing
    cpu = torch.device("cpu")
    ran = []
    for _ in range(ft.HOST_SKIP + len(idle)):
        d = ft._decisions[group][SHAPE]
        if d.schedule != "seq":
            d = ft._watch_host(group, *SHAPE, d, cpu)
        ran.append(d.schedule)
    later = ft._watch_host(group, "ag-gemm", 512, 64, 64, decision(gain_ms), cpu).schedule
    return ran, ft._decisions[group][SHAPE].basis, list(ft.host_bound(group)), later


def worker(rank, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    ft.adapt_to_host(True)
    n = ft.HOST_SAMPLES
    rows = {
        # Rank 0 idle at every sample, rank 1 at none: both turn.
        "one_rank_idle": run_calls(group, [rank == 0] * n, 0.05),
        # Idle at fewer than HOST_IDLE samples on every rank: kept.
        "below": run_calls(group, [i < ft.HOST_IDLE - 1 for i in range(n)], 0.05),
        # Idle throughout but the gain pays for the host: kept, unsampled.
        "large_gain": run_calls(group, [True] * n, ft.HOST_GAIN_MS),
        # Under capture nothing is sampled (the script would run dry).
        "capturing": run_calls(group, [], 0.05, capturing=True),
        # Nor on a side stream (a warm-up before capture).
        "side": run_calls(group, [], 0.05, side=True),
        # Nor in a group with no call needing a gradient (forward only).
        "no_grad": run_calls(group, [], 0.05, grad=False),
    }
    ft.adapt_to_host(False)
    rows["off"] = run_calls(group, [], 0.05)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def test_host_bound_groups_turn_to_seq_alike_on_every_rank(gloo_job):
    n, skip, sched = ft.HOST_SAMPLES, ft.HOST_SKIP, "shard-copy-ring"
    for r, rows in enumerate(gloo_job(worker, WORLD)):
        # The last sampled call decides, and runs seq already; so does a
        # shape first called after the verdict.
        assert rows["one_rank_idle"] == [[sched] * (skip + n - 1) + ["seq"], "host-bound", [n, n], "seq"], r
        assert rows["below"] == [[sched] * (skip + n), "predicted", [n, ft.HOST_IDLE - 1], sched], r
        assert rows["large_gain"] == [[sched] * (skip + n), "predicted", [0, None], sched], r
        for case in ("capturing", "side", "no_grad", "off"):
            assert rows[case] == [[sched] * skip, "predicted", [0, None], sched], (r, case)
