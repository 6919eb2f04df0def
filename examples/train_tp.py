"""Training a stack of Llama-3 blocks, tensor- and sequence-parallel over the
ranks of a job, three ways, side by side:

* ``pytorch``: PyTorch sequential: NCCL collectives with their autograd
  (``all_gather_tensor_autograd``, ``reduce_scatter_tensor_autograd``) and
  matmuls;
* ``async-tp``: the same model under ``torch.compile`` with PyTorch's
  micro-pipeline TP pass (``torch._inductor.config._micro_pipeline_tp``,
  symmetric memory), which fuses the collectives with their matmuls,
  forward and backward; it exists only compiled (``--mode compile``);
* ``ficco``: ``ficco.torch``'s ops, with their backward (``ficco._grad``),
  as set by default: ``all_gather_matmul`` keeps the gathered operand its
  op hands back for the weight gradient (as PyTorch's forward keeps its
  gathered input); ``ficco-keep`` always keeps it; ``ficco-regather``
  always gathers again (less memory); ``ficco-watch`` and ``ficco-nowatch`` turn the
  host watch of ``auto`` on and off (``ficco.torch.adapt_to_host``);
  ``ficco-torchbwd`` runs every input
  gradient as PyTorch's backward does (its collective on the NCCL stream
  beside the weight gradient's GEMM), never as ficco's op
  (``ficco.torch.input_grads_on_ficco(False)``);
* ``no-comm``: the ceiling of any overlap (about the best it can reach,
  not a strict bound): PyTorch's model with each collective replaced by a
  local copy of its output's size (no link traffic, forward and backward),
  the step as if communication cost nothing. Its loss is not the job's
  (not checked) and its learning rate is 0, so that its weights keep the
  values the other ways start from.

The block is ``examples/llama_tp_block.py``'s (RMSNorm without a learned
weight here, so every parameter is a TP shard): per block, all-gather ->
QKV, attention, output projection -> reduce-scatter, all-gather ->
gate/up, SiLU, down -> reduce-scatter. The loss is the mean squared error
of the last block's output against a fixed random target, on a fixed
random batch; SGD updates the weights.

Every way starts from the same weights (one seed) and trains ``--steps``
steps. The script prints each way's loss per step (they must agree with
PyTorch sequential within bf16 tolerance: relative difference below
``--loss-tol``), the weight gradients of the first step against PyTorch's
(relative Frobenius error, the worst parameter), and the median step time
(forward, backward and optimizer step, CUDA events, the slowest rank's)
with the forward and backward apart, and each way's peak memory per rank:
PyTorch's allocator peak above what was allocated before the way started,
and what the way added outside the allocator (NCCL, ficco's shared
buffers).

    torchrun --nproc-per-node 4 examples/train_tp.py --layers 4 --tokens 8192
    torchrun --nproc-per-node 4 examples/train_tp.py --mode all --json train.json

``--mode graphs`` captures each way's forward and backward with
``torch.cuda.make_graphed_callables`` (warmed up eagerly first, as captured
ficco calls need); the loss and the optimizer step stay eager.
"""

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import ficco.torch as ft
from ficco import _grad as ft_grad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_tp_block import rope, rope_tables, slowest  # noqa: E402


WAYS = ("pytorch", "async-tp", "ficco", "ficco-keep", "ficco-regather", "ficco-torchbwd",
        "ficco-watch", "ficco-nowatch", "no-comm")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=8192, help="model width D (Llama-3-70B: 8192)")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=28672)
    p.add_argument("--layers", type=int, default=4, help="blocks in the stack")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (all ranks)")
    p.add_argument("--steps", type=int, default=24, help="training steps per way")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the timing")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--mode", choices=["eager", "graphs", "compile", "all"], default="eager")
    p.add_argument("--ways", default="pytorch,async-tp,ficco,no-comm",
                   help=f"comma-separated, of: {', '.join(WAYS)} (the module's doc says what each is)")
    p.add_argument("--loss-tol", type=float, default=2e-2,
                   help="largest relative difference of a step's loss from PyTorch sequential's")
    p.add_argument("--grad-tol", type=float, default=5e-2,
                   help="largest relative error of a first-step weight gradient against PyTorch's")
    p.add_argument("--json", metavar="FILE", help="rank 0 writes every way's losses, times and memory")
    p.add_argument("--profile", metavar="DIR",
                   help="after the timed steps, profile one more step of each way: rank 0 prints its "
                        "GPU kernels by time and writes a Chrome/Perfetto trace to DIR")
    p.add_argument("--host-breakdown", action="store_true",
                   help="rank 0 prints, per timed step of each ficco way, the host time of ficco's "
                        "Python pieces (forward and backward) and of its native call's phases")
    return p.parse_args()


# ------------------------------------------------------------ the model


def rms_norm(x, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class LocalGather(torch.autograd.Function):
    """``no-comm``'s all-gather: this rank's shard copied `p` times (the
    bytes an all-gather writes, none sent); its backward keeps this rank's
    rows of the gradient (a reduce-scatter's output, nothing summed)."""

    @staticmethod
    def forward(ctx, shard, p, rank):
        ctx.p, ctx.rank = p, rank
        return shard.repeat(p, 1)

    @staticmethod
    def backward(ctx, dfull):
        rows = dfull.shape[0] // ctx.p
        return dfull.narrow(0, ctx.rank * rows, rows).contiguous(), None, None


class LocalScatter(torch.autograd.Function):
    """``no-comm``'s reduce-scatter: this rank's rows (nothing summed or
    sent); its backward is :class:`LocalGather`'s forward."""

    @staticmethod
    def forward(ctx, full, p, rank):
        ctx.p = p
        rows = full.shape[0] // p
        return full.narrow(0, rank * rows, rows).contiguous()

    @staticmethod
    def backward(ctx, dshard):
        return dshard.repeat(ctx.p, 1), None, None


class Comm:
    """How a way runs the block's two communication-dependent matmuls."""

    def __init__(self, name, group):
        self.name, self.group = name, group
        self.p, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def ag_mm(self, a, b):
        if self.name == "ficco":
            return ft.all_gather_matmul(a, b, group=self.group)
        if self.name == "no-comm":
            return LocalGather.apply(a, self.p, self.rank) @ b
        return funcol.all_gather_tensor_autograd(a, 0, self.group) @ b

    def mm_rs(self, a, b):
        if self.name == "ficco":
            return ft.matmul_reduce_scatter(a, b, group=self.group)
        if self.name == "no-comm":
            return LocalScatter.apply(a @ b, self.p, self.rank)
        return funcol.reduce_scatter_tensor_autograd(a @ b, "sum", 0, self.group)


class Stack(torch.nn.Module):
    def __init__(self, cfg, comm, rank, device):
        super().__init__()
        self.cfg, self.comm = cfg, comm
        self.blocks = torch.nn.ModuleList(
            [Block(cfg, rank, device, seed=1234 + i) for i in range(cfg["layers"])]
        )
        cos, sin = rope_tables(cfg["tokens"], cfg["hd"], device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x, self.comm, self.cos, self.sin)
        return x


class Block(torch.nn.Module):
    """This rank's shards of one block, [k, n] row-major (the layout the ops
    take), cut from full weights drawn from one seed: every rank and every
    way holds the same model."""

    def __init__(self, cfg, rank, device, seed):
        super().__init__()
        d, f, p, hd = cfg["dim"], cfg["ffn"], cfg["P"], cfg["hd"]
        self.hq, self.hkv, self.hd = cfg["heads"] // p, cfg["kv_heads"] // p, hd
        g = torch.Generator(device=device)
        g.manual_seed(seed)

        def full(k, n):
            return torch.randn(k, n, device=device, generator=g) / math.sqrt(k)

        def cols(t, width):
            return t[:, rank * width:(rank + 1) * width]

        def param(t):
            return torch.nn.Parameter(t.to(torch.bfloat16).contiguous())

        wq, wk, wv = full(d, cfg["heads"] * hd), full(d, cfg["kv_heads"] * hd), full(d, cfg["kv_heads"] * hd)
        hq, hkv = self.hq, self.hkv
        self.qkv = param(torch.cat([cols(wq, hq * hd), cols(wk, hkv * hd), cols(wv, hkv * hd)], 1))
        self.o = param(full(cfg["heads"] * hd, d)[rank * hq * hd:(rank + 1) * hq * hd])
        wg, wu = full(d, f), full(d, f)
        self.gate_up = param(torch.cat([cols(wg, f // p), cols(wu, f // p)], 1))
        self.down = param(full(f, d)[rank * (f // p):(rank + 1) * (f // p)])

    def forward(self, x, comm, cos, sin):
        hq, hkv, hd = self.hq, self.hkv, self.hd
        tokens = x.shape[0] * comm.p
        qkv = comm.ag_mm(rms_norm(x), self.qkv)
        q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=1)
        q = rope(q.reshape(tokens, hq, hd).transpose(0, 1), cos, sin)
        k = rope(k.reshape(tokens, hkv, hd).transpose(0, 1), cos, sin)
        v = v.reshape(tokens, hkv, hd).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True
        )
        o = o.squeeze(0).transpose(0, 1).reshape(tokens, hq * hd)
        x = x + comm.mm_rs(o.contiguous(), self.o)
        gu = comm.ag_mm(rms_norm(x), self.gate_up)
        g, u = gu.chunk(2, dim=1)
        return x + comm.mm_rs((F.silu(g) * u).contiguous(), self.down)


# ------------------------------------------------------------ one way


def outside_torch_bytes():
    """Device memory in use that PyTorch's allocator does not hold."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def enable_async_tp(group):
    import torch._inductor.config as inductor
    import torch.distributed._symmetric_memory as symm

    if hasattr(symm, "enable_symm_mem_for_group"):
        symm.enable_symm_mem_for_group(group.group_name)
    inductor._micro_pipeline_tp = True


def run_way(way, mode, args, cfg, x, target, group, dev):
    """Trains a fresh model `args.steps` steps; returns the losses, the
    first step's weight gradients, the times and the memory."""
    outside0 = outside_torch_bytes()
    torch.cuda.reset_peak_memory_stats()
    # What is allocated before this way starts (the batch, the reference
    # gradients) is not the way's.
    held0 = torch.cuda.memory_allocated()
    ficco = way.startswith("ficco")
    if ficco:
        # Each way and mode decides as a program that runs only it would.
        ft.forget_decisions(group)
        ft_grad.keep_gathered({"ficco-keep": True, "ficco-regather": False}.get(way, "auto"))
        ft_grad.input_grads_on_ficco(way != "ficco-torchbwd")
        ft.adapt_to_host({"ficco-watch": True, "ficco-nowatch": False}.get(
            way, ft._native.adapt_host_default()))
    comm = Comm("ficco" if ficco else way if way == "no-comm" else "pytorch", group)
    model = Stack(cfg, comm, dist.get_rank(group), dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.0 if way == "no-comm" else args.lr)
    fwd = model
    if way == "async-tp":
        enable_async_tp(group)
    if mode == "compile":
        fwd = torch.compile(model, fullgraph=True)
    elif mode == "graphs":
        fwd = torch.cuda.make_graphed_callables(model, (x,))

    losses, first_grads = [], None
    times = {"step": [], "forward": [], "backward": [], "host_forward": [], "host_backward": []}
    pieces = HostPieces() if args.host_breakdown and ficco else None
    for step in range(args.steps):
        if pieces is not None and step == args.warmup:
            pieces.start()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        opt.zero_grad(set_to_none=False)
        ev[0].record()
        t0 = time.perf_counter()
        out = fwd(x)
        loss = F.mse_loss(out.float(), target)
        t1 = time.perf_counter()
        ev[1].record()
        loss.backward()
        t2 = time.perf_counter()
        ev[2].record()
        if step == 0:
            first_grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        ev[3].record()
        torch.cuda.synchronize()
        losses.append(loss.detach())
        if step >= args.warmup:
            times["step"].append(ev[0].elapsed_time(ev[3]))
            times["forward"].append(ev[0].elapsed_time(ev[1]))
            times["backward"].append(ev[1].elapsed_time(ev[2]))
            # Host time to issue each (autograd's thread issues the backward;
            # loss.backward() returns once it issued everything).
            times["host_forward"].append((t1 - t0) * 1e3)
            times["host_backward"].append((t2 - t1) * 1e3)
    if pieces is not None:
        pieces.report(f"{mode} {way}", args.steps - args.warmup, dist.get_rank(group) == 0)
    if ficco and dist.get_rank(group) == 0:
        samples, idle = ft.host_bound(group)
        seq = sorted(f"{op} {m}x{k}x{n}" for (op, m, k, n), d in ft.decisions(group).items()
                     if d.basis == "host-bound")
        print(f"# {mode} {way}: host watch: {samples} calls sampled, idle at "
              f"{'-' if idle is None else idle} on the rank with the most (host-bound from "
              f"{ft.HOST_IDLE}); seq for host: {', '.join(seq) or 'none'}")
    if args.profile:
        profile_step(way, mode, args.profile, lambda: train_step(fwd, opt, x, target))
    # The job's loss: the mean over ranks of each rank's (its tokens).
    per_step = torch.stack(losses)
    dist.all_reduce(per_step, group=group)
    per_step = (per_step / dist.get_world_size(group)).tolist()
    red = dev
    med = {k: slowest(statistics.median(v), red) for k, v in times.items()}
    mem = {
        "peak_gib": slowest((torch.cuda.max_memory_allocated() - held0) / 2**30, red),
        "outside_torch_gib": slowest((outside_torch_bytes() - outside0) / 2**30, red),
    }
    del fwd, model, opt
    if way == "async-tp":
        import torch._inductor.config as inductor

        inductor._micro_pipeline_tp = False
    torch._dynamo.reset()
    return per_step, first_grads, med, mem


class HostPieces:
    """Host time of ficco's Python pieces and native phases over the timed
    steps (`--host-breakdown`): each piece is wrapped where the op path
    looks it up (module attributes), so nested pieces include their inner
    ones (`_run` holds `_execute`; `_input_grad` holds `_execute` or not)."""

    WRAPPED = [(ft, "_run"), (ft, "_execute"), (ft, "_torch_seq"), (ft, "_decision"),
               (ft_grad, "_input_grad"), (ft_grad, "all_gather_async"),
               (ft_grad, "reduce_scatter_async"), (ft_grad, "all_gather")]

    def __init__(self):
        self.total, self.calls, self.saved = {}, {}, []

    def start(self):
        ft._native.Session.host_times()  # drops the warm-up's
        for mod, name in self.WRAPPED:
            fn = getattr(mod, name)
            self.saved.append((mod, name, fn))
            setattr(mod, name, self._wrap(f"{mod.__name__.split('.')[-1]}.{name}", fn))

    def _wrap(self, key, fn):
        total, calls, clock = self.total, self.calls, time.perf_counter

        def timed(*a, **k):
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                total[key] = total.get(key, 0.0) + clock() - t
                calls[key] = calls.get(key, 0) + 1
        return timed

    def report(self, what, steps, show):
        for mod, name, fn in self.saved:
            setattr(mod, name, fn)
        native = ft._native.Session.host_times()
        if not show:
            return
        print(f"# host breakdown {what}, rank 0, per timed step ({steps} steps)")
        print(f"  {'piece':32} {'calls':>6} {'us/call':>8} {'ms/step':>8}")
        for key in sorted(self.total, key=lambda k: -self.total[k]):
            n = self.calls[key]
            print(f"  {key:32} {n / steps:6.1f} {self.total[key] / n * 1e6:8.1f} "
                  f"{self.total[key] / steps * 1e3:8.3f}")
        for phase, us, n in native:
            print(f"  {'native ' + phase:32} {n / steps:6.1f} {us:8.1f} {us * n / steps / 1e3:8.3f}")


def train_step(fwd, opt, x, target):
    opt.zero_grad(set_to_none=False)
    F.mse_loss(fwd(x).float(), target).backward()
    opt.step()


def profile_step(way, mode, out_dir, step):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    if dist.get_rank() == 0:
        os.makedirs(out_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(out_dir, f"{mode}-{way}.json"))
        print(f"# profile {mode} {way}: GPU kernels by total time (rank 0, one step)")
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=70))


def grad_err(got, want):
    return max(((g.float() - w.float()).norm() / w.float().norm()).item() for g, w in zip(got, want))


def main():
    args = parse_args()
    if "RANK" not in os.environ:
        sys.exit("run under torchrun: torchrun --nproc-per-node N examples/train_tp.py ...")
    if not torch.cuda.is_available():
        sys.exit(
            "train_tp: no CUDA GPU here (torch.cuda.is_available() is False); training runs on "
            "GPUs. Without a GPU, ficco's simulator says which schedule each op gets: "
            "ficco explore --model llama3-70b --tokens 8192 --gpus 4"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        sys.exit(f"train_tp: rank {local_rank} of this node has no GPU of its own "
                 f"({torch.cuda.device_count()} visible); run one process per GPU")
    dev = torch.device("cuda", local_rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    group = dist.group.WORLD
    rank, p = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    cfg = dict(dim=args.dim, heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn,
               tokens=args.tokens, P=p, hd=args.dim // args.heads, layers=args.layers)
    problems = [f"{name} = {v} is not divisible by {by}" for name, v, by in [
        ("--dim", args.dim, args.heads), ("--heads", args.heads, p), ("--kv-heads", args.kv_heads, p),
        ("--ffn", args.ffn, p), ("--tokens", args.tokens, p)] if v % by]
    if problems:
        say("train_tp: " + "; ".join(problems))
        dist.destroy_process_group()
        sys.exit(2)

    g = torch.Generator(device=dev)
    g.manual_seed(100 + rank)
    x = torch.randn(args.tokens // p, args.dim, device=dev, generator=g).to(torch.bfloat16)
    target = torch.randn(args.tokens // p, args.dim, device=dev, generator=g)

    say(f"# Llama-3 TP training: {args.layers} blocks, D={args.dim} H={args.heads} "
        f"Hkv={args.kv_heads} F={args.ffn}, {args.tokens} tokens per step, {p} ranks, "
        f"SGD lr {args.lr}, {args.steps} steps ({args.warmup} untimed)")
    say(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, ficco {ft._native.version()}")
    modes = ["eager", "graphs", "compile"] if args.mode == "all" else [args.mode]
    ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        say(f"train_tp: unknown way(s) {', '.join(unknown)} in --ways; known: {', '.join(WAYS)}")
        dist.destroy_process_group()
        sys.exit(2)
    record = {"tokens": args.tokens, "P": p, "layers": args.layers, "device": torch.cuda.get_device_name(dev),
              "modes": {}}
    failed = False
    for mode in modes:
        res = {}
        ref_grads = None
        for way in ways:
            if way == "async-tp" and mode != "compile":
                say(f"{mode} async-tp: not run (PyTorch's async-TP in training is a torch.compile pass)")
                continue
            try:
                losses, grads, med, mem = run_way(way, mode, args, cfg, x, target, group, dev)
            except Exception as e:
                say(f"{mode} {way}: failed: {type(e).__name__}: {str(e)[:600]}")
                failed |= way != "async-tp"
                torch._dynamo.reset()
                continue
            res[way] = {"losses": losses, "times": med, "memory": mem}
            if way == "pytorch":
                ref_grads = grads
            elif ref_grads is not None and way != "no-comm":
                res[way]["grad_err"] = slowest(grad_err(grads, ref_grads), dev)
            del grads
        record["modes"][mode] = res
        say(f"# mode {mode}")
        base = res.get("pytorch")
        say(f"# {'way':9} {'ms/step':>8} {'fwd':>7} {'bwd':>7} {'vs pytorch':>10} {'peak GiB':>8} "
            f"{'+outside':>8} {'loss[0]':>9} {'loss[-1]':>9} {'max loss diff':>13} {'grad err':>9} "
            f"{'host fwd':>8} {'host bwd':>8}")
        for way, r in res.items():
            t = r["times"]
            speed = base["times"]["step"] / t["step"] if base else float("nan")
            diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base["losses"])) if base else 0.0
            r["max_loss_diff"] = diff
            # no-comm computes something else (the ceiling, not the job's loss).
            ok = way == "no-comm" or diff < args.loss_tol and r.get("grad_err", 0.0) < args.grad_tol
            failed |= not ok
            say(f"  {way:9} {t['step']:8.3f} {t['forward']:7.3f} {t['backward']:7.3f} {speed:9.2f}x "
                f"{r['memory']['peak_gib']:8.2f} {r['memory']['outside_torch_gib']:8.2f} "
                f"{r['losses'][0]:9.5f} {r['losses'][-1]:9.5f} {diff:13.2e} "
                f"{r.get('grad_err', float('nan')):9.2e} {t['host_forward']:8.3f} "
                f"{t['host_backward']:8.3f}{'' if ok else '  MISMATCH'}")
        if any(w.startswith("ficco") for w in res):
            d = ft.decisions(group)
            say("  ficco auto: " + "; ".join(
                f"{op} {m}x{k}x{n}: {v.schedule} (candidate {v.candidate}, {v.basis} gain "
                f"{v.gain_ms:.3f} ms, cost {v.cost_ms:.3f} ms)" for (op, m, k, n), v in d.items()))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    ft.close()
    code = 1 if failed else 0
    if "graphs" in modes:
        # NCCL collectives captured in a CUDA graph can make
        # destroy_process_group hang in ncclCommDestroy (PyTorch issue
        # 115388; seen here after graphs mode, every way's captures freed).
        # The results are written: a bounded teardown, then exit.
        done = threading.Event()
        threading.Thread(target=lambda: (dist.destroy_process_group(), done.set()), daemon=True).start()
        if not done.wait(30):
            print(f"train_tp: rank {rank}: destroy_process_group did not return within 30 s after "
                  "CUDA graphs with NCCL collectives (PyTorch issue 115388); exiting", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    else:
        dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
