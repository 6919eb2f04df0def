"""Whether a collective's blocks can share an SM with a GEMM's (issue 30:
occupancy shaping, arXiv 2606.09200's control, on this GPU).

The control gives a GEMM kernel more dynamic shared memory per block, so
that fewer of its blocks are resident per SM and the collective's blocks
fit beside them. It can work only where the GEMM runs two or more blocks
per SM, and where what one block fewer frees (registers, shared memory,
threads) holds one of the collective's blocks. This records, with the
PyTorch profiler (CUPTI), the launch resources of the kernels that run in
ficco's concurrent suite and its dependent operators: cuBLASLt's GEMMs at
the suite's shapes, ficco's own GEMM (``-own`` and ``-occ2``), and NCCL's
all-reduce, all-gather and reduce-scatter kernels. Then it works out, per
GEMM kernel, its resident blocks per SM and what is left beside them, and
whether one block of each NCCL kernel fits: as launched, and with the
GEMM's shared memory padded to one block fewer per SM.

    torchrun --nproc-per-node 2 bench/probe_residency.py [--json OUT.json]
"""

import argparse
import json
import os
import tempfile


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import ficco.torch as ft

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    size = dist.get_world_size()
    torch.set_grad_enabled(False)
    bf = torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, device=dev).to(bf)

    # The concurrent suite's GEMMs, and two dependent-operator chunk shapes.
    gemms = [(4096, 4096, 4096), (8192, 8192, 8192), (1024, 8192, 2560), (2048, 7168, 8192)]
    big = torch.empty(128 << 20, dtype=bf, device=dev)  # 256 MiB
    a_own, b_own = rand(4096 // size, 4096), rand(4096, 4096)
    own_runs = {}

    def work():
        for m, k, n in gemms:
            torch.mm(rand(m, k), rand(k, n))
        dist.all_reduce(big)
        dist.all_gather_into_tensor(big, big[: big.numel() // size])
        dist.reduce_scatter_tensor(big[: big.numel() // size], big)
        for s in ("shard-nccl-ring-own", "shard-nccl-ring-occ2"):
            try:
                ft.all_gather_matmul(a_own, b_own, schedule=s)
                own_runs[s] = "ran"
            except Exception as e:  # a name the op's space refuses: said below
                own_runs[s] = f"{type(e).__name__}: {str(e)[:160]}"
        torch.cuda.synchronize()

    work()  # set-up (sessions, autotuning, NCCL channels) out of the trace
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]

    props = torch.cuda.get_device_properties(dev)
    sm_regs = getattr(props, "regs_per_multiprocessor", 65536)
    sm_smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    sm_threads = getattr(props, "max_threads_per_multi_processor", 2048)
    # Per block the driver keeps 1 KiB of shared memory for itself (sm_80
    # on), and registers are given per warp in units of 256.
    RESERVED, MAX_BLOCKS = 1024, 32

    def need(k):
        threads = k["threads"]
        warps = -(-threads // 32)
        regs = warps * (-(-k["regs"] * 32 // 256) * 256)
        return regs, k["smem"] + RESERVED, warps * 32

    kernels = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        name = e.get("name", "")
        block = a.get("block", [1, 1, 1])
        k = {"name": name, "grid": a.get("grid"), "block": block,
             "threads": block[0] * block[1] * block[2],
             "regs": int(a.get("registers per thread", 0)),
             "smem": int(a.get("shared memory", 0)),
             "us": e.get("dur", 0.0)}
        low = name.lower()
        k["kind"] = ("nccl" if "nccl" in low else
                     "ficco" if "hgemm" in low else
                     "gemm" if "gemm" in low or "sm90" in low or "cutlass" in low or "nvjet" in low else
                     "other")
        key = (name, k["threads"], k["regs"], k["smem"])
        if key not in kernels:
            kernels[key] = k
    rows = list(kernels.values())
    for k in rows:
        regs, sm, threads = need(k)
        k["limits"] = {"registers": sm_regs // max(regs, 1), "shared memory": sm_smem // sm,
                       "threads": sm_threads // threads}
        k["per_sm"] = min(*k["limits"].values(), MAX_BLOCKS)
    comm = [k for k in rows if k["kind"] == "nccl"]
    verdicts = []
    for g in (k for k in rows if k["kind"] in ("gemm", "ficco")):
        n = g["per_sm"]
        regs, sm, threads = need(g)
        for c in comm:
            c_regs, c_sm, c_threads = need(c)

            def fits(blocks):
                return (blocks * regs + c_regs <= sm_regs and blocks * sm + c_sm <= sm_smem
                        and blocks * threads + c_threads <= sm_threads)

            shaped = None
            if n >= 2:
                # The paper's control: pad the GEMM's shared memory so that
                # n - 1 blocks are resident, and see whether the NCCL block
                # then fits (registers and threads are what the padding
                # cannot free).
                shaped = fits(n - 1)
            verdicts.append({"gemm": g["name"], "comm": c["name"], "gemm_blocks_per_sm": n,
                             "fits_as_launched": fits(n), "fits_shaped": shaped,
                             "regs_left": sm_regs - n * regs, "comm_regs": c_regs,
                             "smem_left": sm_smem - n * sm, "comm_smem": c_sm,
                             "threads_left": sm_threads - n * threads, "comm_threads": c_threads})

    if dist.get_rank() == 0:
        print(f"# {props.name}: per SM {sm_regs} registers, {sm_smem} B shared memory, "
              f"{sm_threads} threads; torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
        print(f"# ficco own-GEMM schedules: {own_runs}")
        print(f"# {'kind':6} {'threads':>7} {'regs':>5} {'smem B':>7} {'blocks/SM':>9} "
              f"{'(regs, smem, threads)':>22}  kernel")
        for k in rows:
            if k["kind"] == "other":
                continue
            lim = k["limits"]
            print(f"  {k['kind']:6} {k['threads']:7d} {k['regs']:5d} {k['smem']:7d} {k['per_sm']:9d} "
                  f"{str((lim['registers'], lim['shared memory'], lim['threads'])):>22}  {k['name'][:90]}")
        print("# one NCCL block beside the GEMM's resident blocks: as launched / with the GEMM's "
              "shared memory padded to one block fewer per SM (- where it runs one block per SM)")
        for v in verdicts:
            shaped = "-" if v["fits_shaped"] is None else ("fits" if v["fits_shaped"] else "no")
            print(f"  {v['gemm'][:48]:48} + {v['comm'][:40]:40} x{v['gemm_blocks_per_sm']}: "
                  f"{'fits' if v['fits_as_launched'] else 'no'} / {shaped} (regs left {v['regs_left']} "
                  f"of {v['comm_regs']} needed, smem left {v['smem_left']} of {v['comm_smem']}, "
                  f"threads left {v['threads_left']} of {v['comm_threads']})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": props.name, "sm": {"regs": sm_regs, "smem": sm_smem,
                                                        "threads": sm_threads},
                           "own": own_runs, "kernels": rows, "verdicts": verdicts}, f, indent=1)
    ft.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
