"""PyTorch anchor beside ficco, for one suite, in one device call.

  python3 bench/anchor.py torch SUITE.toml OUT.jsonl
      For each [[scenario]] whose gpus the machine has: time the sequential
      PyTorch reference (NCCL collective + cuBLAS), the GEMM alone, the
      collective alone, and PyTorch async-TP (symmetric memory fused ops),
      checking async-TP against the reference. One JSON object per scenario.
      MoE scenarios (a2a-gemm, gemm-a2a, with experts/top_k/skew/seed) get
      ficco's routing (the same counts: see _moe_routing) and time
      all_to_all_single with split sizes and the experts' grouped GEMM
      (torch._grouped_mm where PyTorch has it, else a per-expert loop of mm),
      alone and back to back (the sequential reference).
  python3 bench/anchor.py split SUITE.toml OUTDIR
      Writes OUTDIR/suite-pN.toml, one per GPU count of the suite's [[scenario]]s.
  python3 bench/anchor.py report TORCH.jsonl FICCO.json[,FICCO2.json...] [--device D] [--commit C]
      Merges the two into one markdown table (stdout), with suite summaries.

Times are CUDA-event medians of 20 iterations after 5 warm-ups, max over ranks.
"""
import json, math, os, statistics, sys, time


def _timeit(torch, dist, fn, iters=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    t = torch.tensor([statistics.median(ts)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _rel(torch, dist, out, ref):
    e = torch.tensor([((out.float() - ref.float()).norm() / ref.float().norm()).item()], device="cuda")
    dist.all_reduce(e, op=dist.ReduceOp.MAX)
    return e.item()


_SKEW = {"none": 0.0, "moderate": 0.6, "heavy": 1.2}


def _moe_routing(tokens, P, experts, top_k, skew, seed):
    """counts[r][e]: rows rank r routes to expert e. A line-by-line port of
    ficco's crates/ficco-core/src/problem/routing.rs (splitmix64, seeded
    Fisher-Yates popularity order, Zipf weights, top-k draws without
    replacement by rejection then an exact scan), so both see the same counts."""
    import bisect
    M64 = (1 << 64) - 1
    st = [(seed ^ 0x6D6F655F726F7574) & M64]

    def nxt():
        st[0] = (st[0] + 0x9E3779B97F4A7C15) & M64
        z = st[0]
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    unit = lambda: (nxt() >> 11) * (1.0 / (1 << 53))
    below = lambda n: int(unit() * n) % n
    by_rank = list(range(experts))
    for i in range(experts - 1, 0, -1):
        j = below(i + 1)
        by_rank[i], by_rank[j] = by_rank[j], by_rank[i]
    s = _SKEW.get(str(skew), None)
    s = float(skew) if s is None else s
    s = round(s * 1000) / 1000.0
    w = [0.0] * experts
    for i, x in enumerate(by_rank):
        w[x] = 1.0 / float(i + 1) ** s
    total = sum(w)
    cdf, acc = [], 0.0
    for x in w:
        acc += x / total
        cdf.append(acc)
    counts = [[0] * experts for _ in range(P)]
    for r in range(P):
        for _ in range(tokens // P):
            picked = set()
            for _ in range(top_k):
                x = None
                for _ in range(32):
                    c = min(bisect.bisect_right(cdf, unit()), experts - 1)
                    if c not in picked:
                        x = c
                        break
                if x is None:
                    left = sum(w[e] for e in range(experts) if e not in picked)
                    u, x = unit() * left, None
                    for e in range(experts):
                        if e in picked:
                            continue
                        x = e
                        if u < w[e]:
                            break
                        u -= w[e]
                picked.add(x)
            for x in picked:
                counts[r][x] += 1
    return counts


def _moe(torch, dist, T, sc, rank, P, r):
    """Times one MoE scenario: the all-to-all with split sizes, the grouped
    GEMM of this rank's experts over the rows it holds (source-major, as
    all_to_all_single delivers them), and both back to back."""
    bf = torch.bfloat16
    M, K, N, op = sc["m"], sc["k"], sc["n"], sc["op"]
    E, k = sc["experts"], sc["top_k"]
    counts = _moe_routing(M, P, E, k, sc.get("skew", "none"), sc.get("seed", 1))
    L = E // P
    pair = lambda s, q: sum(counts[s][q * L:(q + 1) * L])
    send = [pair(rank, q) for q in range(P)]
    recv = [pair(s, rank) for s in range(P)]
    r.update(experts=E, top_k=k, skew=sc.get("skew", "none"), rows_received=sum(recv))
    # Groups: (source, local expert) segments in source-major order.
    seg = [counts[s][rank * L + e] for s in range(P) for e in range(L)]
    W = torch.randn(L, K, N, device="cuda", dtype=bf) / math.sqrt(K)
    dispatch = op == "a2a-gemm"
    cols = K if dispatch else N
    X = torch.randn(sum(send) if dispatch else sum(recv), cols if dispatch else K, device="cuda", dtype=bf)
    R = torch.empty(sum(recv), K, device="cuda", dtype=bf) if dispatch else torch.empty(sum(recv), N, device="cuda", dtype=bf)
    Y = torch.empty(sum(recv), N, device="cuda", dtype=bf) if dispatch else torch.empty(sum(send), N, device="cuda", dtype=bf)
    gin = R if dispatch else X
    gout = Y if dispatch else R
    offs = torch.tensor([sum(seg[:i + 1]) for i in range(len(seg))], device="cuda", dtype=torch.int32)
    Wg = W.repeat(P, 1, 1)  # one weight per (source, expert) group
    grouped = hasattr(torch, "_grouped_mm")
    r["grouped"] = "torch._grouped_mm" if grouped else "per-expert loop"

    def gemm():
        if grouped:
            gout.copy_(torch._grouped_mm(gin, Wg, offs=offs))
            return
        at = 0
        for i, n in enumerate(seg):
            if n:
                torch.mm(gin[at:at + n], W[i % L], out=gout[at:at + n])
            at += n

    if dispatch:
        a2a = lambda: dist.all_to_all_single(R, X, output_split_sizes=recv, input_split_sizes=send)
        seq = lambda: (a2a(), gemm())
    else:
        a2a = lambda: dist.all_to_all_single(Y, R, output_split_sizes=send, input_split_sizes=recv)
        seq = lambda: (gemm(), a2a())
    r["compute_ms"] = T(gemm)
    r["comm_ms"] = T(a2a)
    r["seq_ms"] = T(seq)


def _worker(rank, P, scens, outpath):
    import torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29700 + P))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=P, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD.group_name
    import torch.distributed._symmetric_memory as symm
    if hasattr(symm, "enable_symm_mem_for_group"):
        import warnings
        warnings.simplefilter("ignore")
        symm.enable_symm_mem_for_group(group)
    bf = torch.bfloat16
    T = lambda fn: _timeit(torch, dist, fn)
    rows = []
    for sc in scens:
        M, K, N, op = sc["m"], sc["k"], sc["n"], sc["op"]
        r = dict(name=sc["name"], op=op, m=M, k=K, n=N, gpus=P)
        try:
            torch.manual_seed(1234 + rank)
            if op in ("a2a-gemm", "gemm-a2a"):
                _moe(torch, dist, T, sc, rank, P, r)
            elif op == "ag-gemm":
                A = torch.randn(M // P, K, device="cuda", dtype=bf)
                B = torch.randn(K, N, device="cuda", dtype=bf) / math.sqrt(K)
                Ag = torch.empty(M, K, device="cuda", dtype=bf)
                C = torch.empty(M, N, device="cuda", dtype=bf)
                seq = lambda: (dist.all_gather_into_tensor(Ag, A), torch.mm(Ag, B, out=C))
                tp = lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, group)
                r["compute_ms"] = T(lambda: torch.mm(Ag, B, out=C))
                r["comm_ms"] = T(lambda: dist.all_gather_into_tensor(Ag, A))
                r["seq_ms"] = T(seq)
                seq()
                r["torch_tp_err"] = _rel(torch, dist, tp()[1][0], C)
                r["torch_tp_ms"] = T(tp)
            else:
                A = torch.randn(M, K, device="cuda", dtype=bf)
                B = torch.randn(K, N, device="cuda", dtype=bf) / math.sqrt(K)
                C = torch.empty(M, N, device="cuda", dtype=bf)
                O = torch.empty(M // P, N, device="cuda", dtype=bf)
                r["compute_ms"] = T(lambda: torch.mm(A, B, out=C))
                if op == "gemm-rs":
                    seq = lambda: (torch.mm(A, B, out=C), dist.reduce_scatter_tensor(O, C))
                    tp = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group)
                    r["comm_ms"] = T(lambda: dist.reduce_scatter_tensor(O, C))
                    r["seq_ms"] = T(seq)
                    seq()
                    r["torch_tp_err"] = _rel(torch, dist, tp(), O)
                    r["torch_tp_ms"] = T(tp)
                else:
                    r["comm_ms"] = T(lambda: dist.all_reduce(C))
                    r["seq_ms"] = T(lambda: (torch.mm(A, B, out=C), dist.all_reduce(C)))
            r["ideal_ms"] = max(r["compute_ms"], r["comm_ms"])
        except Exception as ex:  # keep going: one failing scenario must not hide the rest
            r["error"] = repr(ex)[:300]
        rows.append(r)
        if rank == 0:
            print(f"torch {r['name']}: seq {r.get('seq_ms', float('nan')):.3f} tp {r.get('torch_tp_ms', float('nan')):.3f}", flush=True)
    if rank == 0:
        with open(outpath, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


def torch_main(suite, outpath):
    import tomllib
    import torch, torch.multiprocessing as mp
    scens = tomllib.load(open(suite, "rb")).get("scenario", [])
    ngpu = torch.cuda.device_count()
    open(outpath, "w").close()
    for P in sorted({s["gpus"] for s in scens if s["gpus"] <= ngpu}, reverse=True):
        mp.spawn(_worker, args=(P, [s for s in scens if s["gpus"] == P], outpath), nprocs=P, join=True)


def _geo(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def report_main(torch_path, ficco_path, device, commit):
    torch_rows = {r["name"]: r for r in map(json.loads, open(torch_path)) if r.get("name")}
    scen = []
    for path in ficco_path.split(","):
        try:
            doc = json.load(open(path))
        except (OSError, ValueError) as ex:
            print(f"<!-- skipped {path}: {ex} -->")
            continue
        scen += doc["scenarios"] if "scenarios" in doc else [doc]
    f = lambda x: "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"
    f2 = lambda x: "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"
    out = []
    out.append(f"## Side by side: ficco vs PyTorch async-TP ({time.strftime('%Y-%m-%d')}, {device}, commit {commit})\n")
    out.append("Command: `bench/anchor.sh suites/llama3.toml $OUT` (torch and ficco in one device call). "
               "Times are medians in ms, max over ranks. seq/ideal/torch columns come from PyTorch; "
               "ficco E is computed against ficco's own measured seq and ideal, torch E against PyTorch's.\n")
    out.append("| scenario | op | P | torch seq | torch ideal | torch async-TP | ficco seq | ficco ideal | ficco best | ficco ms | launch µs | ficco E | torch E | ficco / torch | wrong |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    launches = []
    agg = {}
    wrong_total = 0
    for s in scen:
        name = s["scenario"]
        t = torch_rows.get(name, {})
        ref = s["reference"]
        best = s.get("best")
        bt = next((x["time_ms"] for x in s["schedules"] if x["name"] == best), None)
        lu = next((x.get("launch_us") for x in s["schedules"] if x["name"] == best), None)
        if lu is not None:
            launches.append(lu)
        # A row with `same_plan_as` repeats another row's measurement: count it once.
        wrong = sum(1 for x in s["schedules"] if x.get("skipped") is None and x.get("same_plan_as") is None and
                    (x.get("max_rel_err") is None or not (x["max_rel_err"] <= 1e-2)))
        wrong_total += wrong
        fe = (ref["sequential_ms"] - bt) / (ref["sequential_ms"] - ref["ideal_ms"]) if bt and ref["sequential_ms"] > ref["ideal_ms"] else None
        te = None
        if "torch_tp_ms" in t and t["seq_ms"] > t["ideal_ms"]:
            te = (t["seq_ms"] - t["torch_tp_ms"]) / (t["seq_ms"] - t["ideal_ms"])
        ratio = bt / t["torch_tp_ms"] if bt and t.get("torch_tp_ms") else None
        out.append(f"| {name} | {s['op']} | {s['gpus']} | {f(t.get('seq_ms'))} | {f(t.get('ideal_ms'))} | {f(t.get('torch_tp_ms'))} | "
                   f"{f(ref['sequential_ms'])} | {f(ref['ideal_ms'])} | {best} | {f(bt)} | {'n/a' if lu is None else f'{lu:.0f}'} | {f2(fe)} | {f2(te)} | {f2(ratio)} | {wrong} |")
        a = agg.setdefault(s["gpus"], dict(fs=0.0, fi=0.0, ts=0.0, ti=0.0, fr=[], tr=[], fslow=0, tslow=0, beat=0, n_tp=0,
                                           xs=0.0, xi=0.0, xr=[]))
        if bt and "seq_ms" in t:
            # ficco against PyTorch's own reference: the yardstick of torch's E.
            a["xs"] += t["seq_ms"] - bt
            a["xi"] += t["seq_ms"] - t["ideal_ms"]
            a["xr"].append(bt / t["ideal_ms"])
        if bt:
            a["fs"] += ref["sequential_ms"] - bt
            a["fi"] += ref["sequential_ms"] - ref["ideal_ms"]
            a["fr"].append(bt / ref["ideal_ms"])
            a["fslow"] += bt > ref["sequential_ms"]
        if "torch_tp_ms" in t:
            a["ts"] += t["seq_ms"] - t["torch_tp_ms"]
            a["ti"] += t["seq_ms"] - t["ideal_ms"]
            a["tr"].append(t["torch_tp_ms"] / t["ideal_ms"])
            a["tslow"] += t["torch_tp_ms"] > t["seq_ms"]
            a["n_tp"] += 1
            a["beat"] += bool(bt and bt < t["torch_tp_ms"])
    out.append("")
    out.append("| P | ficco aggregated E | torch aggregated E | ficco geomean T/T_ideal | torch geomean T/T_ideal | ficco E, torch's reference | ficco geomean T/T_ideal, torch's ideal | ficco slower than seq | torch slower than seq | ficco faster than torch |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for P, a in sorted(agg.items()):
        fe = a["fs"] / a["fi"] if a["fi"] > 0 else float("nan")
        te = a["ts"] / a["ti"] if a["ti"] > 0 else float("nan")
        xe = a["xs"] / a["xi"] if a["xi"] > 0 else float("nan")
        out.append(f"| {P} | {fe:.2f} | {te:.2f} | {_geo(a['fr']):.3f} | {_geo(a['tr']):.3f} | {xe:.2f} | {_geo(a['xr']):.3f} | {a['fslow']} | {a['tslow']} | {a['beat']} of {a['n_tp']} |")
    allf = [x for a in agg.values() for x in a["fr"]]
    allx = [x for a in agg.values() for x in a["xr"]]
    out.append(f"\nWhole suite: ficco geomean T_best/T_ideal {_geo(allf):.3f} against its own references, {_geo(allx):.3f} against PyTorch's ideal.")
    if launches:
        launches.sort()
        out.append(f"\nHost-side launch of one overlapped operator (the best schedule, no CUDA graphs, median over iterations, "
                   f"max over ranks): median {launches[len(launches) // 2]:.0f} µs, max {launches[-1]:.0f} µs over {len(launches)} scenarios.")
    out.append(f"\nWrong schedule outputs over the whole sweep: {wrong_total}.\n")
    print("\n".join(out))


def split_main(suite, outdir):
    import tomllib
    scens = tomllib.load(open(suite, "rb")).get("scenario", [])
    for P in sorted({s["gpus"] for s in scens}, reverse=True):
        with open(f"{outdir}/suite-p{P}.toml", "w") as fh:
            for s in scens:
                if s["gpus"] == P:
                    fh.write("[[scenario]]\n" + "".join(
                        f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {v}\n" for k, v in s.items()) + "\n")
        print(P)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "torch":
        torch_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "split":
        split_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "report":
        args = sys.argv[4:]
        opt = lambda k, d: args[args.index(k) + 1] if k in args else d
        report_main(sys.argv[2], sys.argv[3], opt("--device", "unknown device"), opt("--commit", "unknown"))
    else:
        sys.exit(__doc__)
