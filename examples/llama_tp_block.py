"""The forward pass of one Llama-3 transformer block, tensor- and sequence-
parallel over the ranks of a job, run three ways and compared:

* ``pytorch``: PyTorch sequential (``all_gather_into_tensor`` then ``@``;
  ``@`` then ``reduce_scatter_tensor``);
* ``async-tp``: PyTorch async-TP, its fused symmetric-memory ops
  (``torch.ops.symm_mem.fused_all_gather_matmul`` and
  ``fused_matmul_reduce_scatter``);
* ``ficco``: ``ficco.torch.all_gather_matmul`` and ``matmul_reduce_scatter``;
* ``no-comm``: the ceiling of any overlap (about the best it can reach,
  not a strict bound): PyTorch sequential with each collective replaced by
  a local copy of its output's size (no link traffic), the block as if
  communication cost nothing. It computes something else (its error is
  not checked).

The block (Megatron-style TP with sequence parallelism, as async-TP runs it):
each rank holds T/P tokens of the residual stream ``x`` ``[T/P, D]``::

    h   = RMSNorm(x)
    qkv = all_gather(h) @ W_qkv[r]          AG->GEMM   [T, (H + 2 Hkv) hd / P]
    o   = SDPA(RoPE(q), RoPE(k), v), causal, grouped-query heads
    x   = x + reduce_scatter(o @ W_o[r])    GEMM->RS   [T/P, D]
    h   = RMSNorm(x)
    gu  = all_gather(h) @ W_gate_up[r]      AG->GEMM   [T, 2 F / P]
    x   = x + reduce_scatter((silu(g) * u) @ W_down[r])   GEMM->RS

It checks that every way's block output agrees with PyTorch sequential within
bf16 tolerance (relative Frobenius error of the block's update, x_out - x_in,
below 2e-2) and prints the time per block (CUDA events, after a warm-up, the
median over ``--iters``, the slowest rank's).

``--mode`` runs the block eagerly (``eager``), captured in a CUDA graph and
replayed (``graphs``: each way is warmed up eagerly first, as captured ficco
calls need), or through ``torch.compile(fullgraph=True)`` (``compile``), or
all three (``all``). For ficco it prints what ``schedule="auto"`` decided
at each call site: the schedule, the candidate it weighed, its gain (measured
by ``ficco tune`` or predicted) against the call's own cost, and the sum of
those gains beside the block's measured saving.

    torchrun --nproc-per-node 4 examples/llama_tp_block.py            # Llama-3-70B block, 8192 tokens
    torchrun --nproc-per-node 2 examples/llama_tp_block.py --loopback \\
        --dim 2048 --heads 16 --kv-heads 8 --ffn 8192 --tokens 2048   # every rank on cuda:0 (gloo)

``--loopback`` runs every rank on cuda:0 with a gloo process group (NCCL
cannot put two ranks on one GPU) and skips async-TP, which needs NCCL; its
times say nothing about performance.
"""

import argparse
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ficco.torch as ft

TOLERANCE = 2e-2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=8192, help="model width D (Llama-3-70B: 8192)")
    p.add_argument("--heads", type=int, default=64, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads Hkv (grouped-query attention)")
    p.add_argument("--ffn", type=int, default=28672, help="MLP hidden size F")
    p.add_argument("--tokens", type=int, default=8192, help="tokens T of the sequence (all ranks)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (after --warmup)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--schedule", default="auto", help="ficco schedule for every op ('auto': tuned, else rules)")
    p.add_argument("--loopback", action="store_true", help="every rank on cuda:0, gloo; no async-TP")
    p.add_argument("--mode", choices=["eager", "graphs", "compile", "all"], default="eager",
                   help="eager calls, a CUDA graph per block, torch.compile(fullgraph=True), or all three")
    p.add_argument("--site-times", action="store_true",
                   help="eager mode: also time each call site inside the block (CUDA events around "
                        "each op call, the slowest rank's median per site), to tell which sites keep "
                        "their harness saving in the block and what the rest of the block costs")
    p.add_argument("--json", metavar="FILE",
                   help="rank 0 writes the times per mode and way and what each ficco call site ran "
                        "(bench/block_vs_harness.py compares it with the harness)")
    return p.parse_args()


# ------------------------------------------------------------ the block


def rms_norm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rope_tables(tokens, head_dim, device, theta=500000.0):
    """cos and sin of Llama-3's rotary embedding, [T, hd/2] (theta 500000)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(tokens, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    """x [heads, T, hd]: rotate each (even, odd) pair by its position's angle."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


def block(x, w, comm, cfg):
    """One block's forward on this rank's token shard x [T/P, D]."""
    p, hd = cfg["P"], cfg["hd"]
    hq, hkv = cfg["heads"] // p, cfg["kv_heads"] // p
    tokens = x.shape[0] * p

    h = rms_norm(x, w["attn_norm"])
    qkv = comm.ag_mm("qkv", h, w["qkv"])  # [T, (hq + 2 hkv) hd]
    q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=1)
    q = rope(q.reshape(tokens, hq, hd).transpose(0, 1), *w["rope"])
    k = rope(k.reshape(tokens, hkv, hd).transpose(0, 1), *w["rope"])
    v = v.reshape(tokens, hkv, hd).transpose(0, 1)
    o = F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True
    )
    o = o.squeeze(0).transpose(0, 1).reshape(tokens, hq * hd).contiguous()
    x = x + comm.mm_rs("o", o, w["o"])

    h = rms_norm(x, w["mlp_norm"])
    gu = comm.ag_mm("gate_up", h, w["gate_up"])  # [T, 2 F/P]
    g, u = gu.chunk(2, dim=1)
    act = (F.silu(g.float()) * u.float()).to(x.dtype).contiguous()
    return x + comm.mm_rs("down", act, w["down"])


def make_weights(cfg, rank, device):
    """This rank's shards of one block's weights, [k, n] row-major (the
    layout the ops take), cut from full weights drawn from one seed, so
    every rank (and every way) holds the same model."""
    d, f, p, hd = cfg["dim"], cfg["ffn"], cfg["P"], cfg["hd"]
    hq, hkv = cfg["heads"] // p, cfg["kv_heads"] // p
    g = torch.Generator(device=device)
    g.manual_seed(1234)

    def full(k, n):
        return torch.randn(k, n, device=device, generator=g, dtype=torch.float32) / math.sqrt(k)

    def cols(t, width, r=rank):
        return t[:, r * width:(r + 1) * width]

    wq, wk, wv = full(d, cfg["heads"] * hd), full(d, cfg["kv_heads"] * hd), full(d, cfg["kv_heads"] * hd)
    wo = full(cfg["heads"] * hd, d)
    wg, wu, wdown = full(d, f), full(d, f), full(f, d)
    bf = torch.bfloat16
    return {
        "attn_norm": (1 + 0.1 * torch.randn(d, device=device, generator=g)).to(bf),
        "mlp_norm": (1 + 0.1 * torch.randn(d, device=device, generator=g)).to(bf),
        "qkv": torch.cat([cols(wq, hq * hd), cols(wk, hkv * hd), cols(wv, hkv * hd)], 1).to(bf).contiguous(),
        "o": wo[rank * hq * hd:(rank + 1) * hq * hd].to(bf).contiguous(),
        "gate_up": torch.cat([cols(wg, f // p), cols(wu, f // p)], 1).to(bf).contiguous(),
        "down": wdown[rank * (f // p):(rank + 1) * (f // p)].to(bf).contiguous(),
        "rope": rope_tables(cfg["tokens"], hd, device),
    }


# ------------------------------------------------------------ three ways


class Sequential:
    """PyTorch sequential: the collective, then the GEMM (or the reverse).
    On gloo (loopback), which has no reduce-scatter, the same result comes
    from an all-reduce and this rank's rows."""

    name = "pytorch"

    def __init__(self, group, nccl):
        self.group, self.nccl = group, nccl
        self.p = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def ag_mm(self, site, a, b):
        if self.nccl:
            full = torch.empty(a.shape[0] * self.p, a.shape[1], dtype=a.dtype, device=a.device)
            dist.all_gather_into_tensor(full, a, group=self.group)
        else:
            parts = [torch.empty_like(a) for _ in range(self.p)]
            dist.all_gather(parts, a, group=self.group)
            full = torch.cat(parts)
        return full @ b

    def mm_rs(self, site, a, b):
        y = a @ b
        rows = y.shape[0] // self.p
        if self.nccl:
            out = torch.empty(rows, y.shape[1], dtype=y.dtype, device=y.device)
            dist.reduce_scatter_tensor(out, y, group=self.group)
            return out
        dist.all_reduce(y, group=self.group)
        return y[self.rank * rows:(self.rank + 1) * rows].contiguous()


class NoComm:
    """The ceiling: the all-gather becomes this rank's shard copied P times
    (the bytes it writes), the reduce-scatter this rank's rows of the
    product (nothing summed or sent)."""

    name = "no-comm"

    def __init__(self, group):
        self.p, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def ag_mm(self, site, a, b):
        return a.repeat(self.p, 1) @ b

    def mm_rs(self, site, a, b):
        y = a @ b
        rows = y.shape[0] // self.p
        return y[self.rank * rows:(self.rank + 1) * rows].contiguous()


class AsyncTP:
    """PyTorch async-TP: its fused symmetric-memory ops."""

    name = "async-tp"

    def __init__(self, group):
        import torch.distributed._symmetric_memory as symm

        self.gname = group.group_name
        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(self.gname)

    def ag_mm(self, site, a, b):
        _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, self.gname, return_A=False)
        return outs[0]

    def mm_rs(self, site, a, b):
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, self.gname)


class Ficco:
    """ficco's ops; remembers what each call site ran (eager calls)."""

    name = "ficco"

    def __init__(self, group, schedule):
        self.group, self.schedule = group, schedule
        self.p = dist.get_world_size(group)
        self.ran, self.shape = {}, {}

    def note(self, site, op, m, k, n):
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            return
        self.ran[site] = ft.last_schedule(self.group)
        self.shape[site] = (op, m, k, n)

    def ag_mm(self, site, a, b):
        out = ft.all_gather_matmul(a, b, group=self.group, schedule=self.schedule)
        self.note(site, "ag-gemm", a.shape[0] * self.p, a.shape[1], b.shape[1])
        return out

    def mm_rs(self, site, a, b):
        out = ft.matmul_reduce_scatter(a, b, group=self.group, schedule=self.schedule)
        self.note(site, "gemm-rs", a.shape[0], a.shape[1], b.shape[1])
        return out


# ------------------------------------------------------------ measuring


def slowest(value, device):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_block(fn, iters, warmup, device):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return slowest(statistics.median(times), device)


def runner(mode, way, x, w, cfg):
    """A thunk running one block of `way` in `mode`, and its first output.
    Graphs: two eager warm-up blocks (a captured ficco call needs its shape
    set up), then a capture; compile: torch.compile(fullgraph=True)."""
    if mode == "eager":
        return (lambda: block(x, w, way, cfg)), block(x, w, way, cfg)
    if mode == "compile":
        f = torch.compile(lambda xx: block(xx, w, way, cfg), fullgraph=True)
        return (lambda: f(x)), f(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            block(x, w, way, cfg)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = block(x, w, way, cfg)
    g.replay()
    return g.replay, out


class SiteTimer:
    """Wraps a way: CUDA events on the caller's stream around each op call.
    A call's work joins the caller's stream before it returns (ficco's
    included), so each pair spans the op on the device, in the block."""

    def __init__(self, comm):
        self.comm, self.name, self.marks = comm, comm.name, []

    def _timed(self, fn, site, a, b):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = fn(site, a, b)
        e.record()
        self.marks.append((site, s, e))
        return out

    def ag_mm(self, site, a, b):
        return self._timed(self.comm.ag_mm, site, a, b)

    def mm_rs(self, site, a, b):
        return self._timed(self.comm.mm_rs, site, a, b)


def site_times(x, w, way, cfg, iters, device):
    """Per call site, the median in-block time (ms, slowest rank), and the
    block's median: eager blocks, synchronized after each. Each site's
    slowest rank may differ (a collective absorbs the ranks' skew on
    whichever rank arrives first), so the sites' sum can exceed any rank's
    share of the block, and the block outside them ("rest") can read low
    (at 16384 tokens on 4 H200s PyTorch's read 0.8 ms below every other
    way's: bench/RESULTS.md, eleventh session)."""
    timer = SiteTimer(way)
    blocks = []
    for _ in range(iters):
        timer.marks.clear()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        block(x, w, timer, cfg)
        e.record()
        torch.cuda.synchronize()
        blocks.append((s.elapsed_time(e), [(site, a.elapsed_time(b)) for site, a, b in timer.marks]))
    sites = {}
    for _, marks in blocks:
        for site, ms in marks:
            sites.setdefault(site, []).append(ms)
    out = {site: slowest(statistics.median(v), device) for site, v in sites.items()}
    out["block"] = slowest(statistics.median(b for b, _ in blocks), device)
    return out


def rel_err(got, want, base):
    d_got, d_want = got.float() - base.float(), want.float() - base.float()
    return ((d_got - d_want).norm() / d_want.norm()).item()


def main():
    args = parse_args()
    if "RANK" not in os.environ:
        sys.exit("run under torchrun: torchrun --nproc-per-node N examples/llama_tp_block.py ...")
    if not torch.cuda.is_available():
        # Before any CUDA call: PyTorch's own error would be a traceback.
        sys.exit(
            "llama_tp_block: no CUDA GPU here (torch.cuda.is_available() is False); the block "
            "runs on GPUs (--loopback: every rank on one). Without a GPU, ficco's simulator "
            "says which schedule each layer gets: "
            "ficco explore --model llama3-70b --tokens 8192 --gpus 4"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not args.loopback and local_rank >= torch.cuda.device_count():
        sys.exit(
            f"llama_tp_block: rank {local_rank} of this node has no GPU of its own "
            f"({torch.cuda.device_count()} visible); run as many processes per node as GPUs, "
            "or --loopback to put every rank on cuda:0"
        )
    dev = torch.device("cuda", 0 if args.loopback else local_rank)
    torch.cuda.set_device(dev)
    if args.loopback:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=dev)
    group = dist.group.WORLD
    rank, p = dist.get_rank(), dist.get_world_size()
    # Collectives on gloo reduce host copies; NCCL needs device tensors.
    red_dev = dev if not args.loopback else torch.device("cpu")
    say = print if rank == 0 else (lambda *a, **k: None)

    cfg = dict(dim=args.dim, heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn,
               tokens=args.tokens, P=p, hd=args.dim // args.heads)
    problems = [f"{name} = {v} is not divisible by {by}" for name, v, by in [
        ("--dim", args.dim, args.heads), ("--heads", args.heads, p), ("--kv-heads", args.kv_heads, p),
        ("--ffn", args.ffn, p), ("--tokens", args.tokens, p)] if v % by]
    if problems:
        say("llama_tp_block: " + "; ".join(problems))
        dist.destroy_process_group()
        sys.exit(2)

    w = make_weights(cfg, rank, dev)
    g = torch.Generator(device=dev)
    g.manual_seed(100 + rank)
    x = torch.randn(args.tokens // p, args.dim, device=dev, generator=g).to(torch.bfloat16)

    ways = [Sequential(group, nccl=not args.loopback)]
    if not args.loopback:
        try:
            ways.append(AsyncTP(group))
        except Exception as e:  # an older PyTorch, no symmetric memory
            say(f"async-tp: unavailable ({type(e).__name__}: {e})")
    ways.append(Ficco(group, args.schedule))
    if not args.loopback:
        ways.append(NoComm(group))

    say(f"# Llama-3 TP block: D={args.dim} H={args.heads} Hkv={args.kv_heads} F={args.ffn} "
        f"T={args.tokens} on {p} ranks{' (loopback: every rank on cuda:0, gloo)' if args.loopback else ''}")
    say(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, ficco {ft._native.version()}")
    modes = ["eager", "graphs", "compile"] if args.mode == "all" else [args.mode]
    failed = False
    record = {"tokens": args.tokens, "P": p, "device": torch.cuda.get_device_name(dev),
              "times": {}, "sites": []}
    with torch.no_grad():
        # The reference: PyTorch sequential, eager.
        ref = block(x, w, ways[0], cfg)
        for mode in modes:
            outs, times = {}, {}
            # Each mode decides as a program that runs only that way would
            # (the eager mode's host watch must not decide for graphs).
            ft.forget_decisions(group)
            for way in ways:
                try:
                    run, outs[way.name] = runner(mode, way, x, w, cfg)
                    ft._native.Session.host_times()  # from the timed blocks on
                    times[way.name] = time_block(run, args.iters, args.warmup, red_dev)
                    if isinstance(way, Ficco):
                        host = ft._native.Session.host_times()
                except Exception as e:
                    say(f"{mode} {way.name}: failed: {type(e).__name__}: {str(e)[:400]}")
                    failed |= way.name != "async-tp"
            record["times"][mode] = dict(times)
            if args.site_times and mode == "eager":
                per = {}
                for way in ways:
                    if way.name in outs:
                        per[way.name] = site_times(x, w, way, cfg, args.iters, red_dev)
                record["site_times"] = per
            say(f"# mode {mode}")
            say(f"# {'way':10} {'ms/block':>9} {'vs pytorch':>10} {'rel err':>9}")
            for way in ways:
                if way.name not in outs:
                    continue
                err = slowest(rel_err(outs[way.name], ref, x), red_dev)
                # no-comm computes something else: the ceiling, not the block.
                ok = err < TOLERANCE or isinstance(way, NoComm)
                failed |= not ok
                t = times[way.name]
                speed = times["pytorch"] / t if "pytorch" in times else float("nan")
                shown = "(ceiling)" if isinstance(way, NoComm) else f"{err:9.2e}"
                say(f"  {way.name:10} {t:9.3f} {speed:9.2f}x {shown:>9}{'' if ok else '  MISMATCH'}")
            fc = next((w_ for w_ in ways if isinstance(w_, Ficco)), None)
            if fc is not None and "ficco" in times:
                blocks = args.iters + args.warmup
                say("  ficco native host per block (rank 0): " + ", ".join(
                    f"{ph} {n / blocks:.1f} x {us:.0f} us" for ph, us, n in host
                    if ph in ("launch", "issue", "capture", "full")))
            if fc is not None:
                samples, idle = ft.host_bound(group)
                say(f"  ficco host watch: {samples} calls sampled, idle at "
                    f"{'-' if idle is None else idle} on the rank with the most (host-bound from "
                    f"{ft.HOST_IDLE})")
            if mode == "eager" and "site_times" in record:
                per = record["site_times"]
                names = [n for n in per]
                say("  in-block ms per call site (events around each call; 'rest' is the block "
                    "outside the four calls):")
                say("    " + f"{'site':8}" + "".join(f"{n:>10}" for n in names)
                    + ("  ficco saves" if "pytorch" in per and "ficco" in per else ""))
                for site in list(next(iter(per.values())).keys()) + ["rest"]:
                    def ms(n):
                        t = per[n]
                        if site != "rest":
                            return t[site]
                        return t["block"] - sum(v for k, v in t.items() if k != "block")
                    row = "    " + f"{site:8}" + "".join(f"{ms(n):10.3f}" for n in names)
                    if "pytorch" in per and "ficco" in per:
                        row += f"  {ms('pytorch') - ms('ficco'):10.3f}"
                    say(row)
            if mode == "eager" and fc is not None:
                say("  ficco schedules: " + ", ".join(f"{k}={v}" for k, v in fc.ran.items()))
                decided = ft.decisions(group)
                gains = 0.0
                for site, shape in fc.shape.items():
                    d = decided.get(shape)
                    op, m, k, n = shape
                    record["sites"].append({"site": site, "op": op, "m": m, "k": k, "n": n,
                                            "ran": fc.ran.get(site),
                                            "decision": d._asdict() if d is not None else None})
                    if d is None:  # a forced schedule
                        continue
                    say(f"  auto {site}: {op} m={m} k={k} n={n}: runs {d.schedule}; candidate "
                        f"{d.candidate} ({d.basis}: seq {d.seq_ms:.3f} ms, candidate "
                        f"{d.candidate_ms:.3f} ms, gain {d.gain_ms:.3f} ms, call cost {d.cost_ms:.3f} ms)")
                    if d.schedule != "seq":
                        gains += d.gain_ms
                if "pytorch" in times and "ficco" in times:
                    say(f"  block saving {times['pytorch'] - times['ficco']:.3f} ms; "
                        f"the chosen schedules' gains per block (as decided) {gains:.3f} ms")
    if args.json and rank == 0:
        import json

        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    ft.close()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
