"""One rank of the loopback tests (`test_gpu_loopback.py` starts it).

Every rank runs on cuda:0 with a gloo process group (NCCL cannot put two
ranks on one GPU). The launcher environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) comes from the test.

    python loopback_worker.py ops OUT.json      every op, forced and "auto"
    python loopback_worker.py repeat OUT.json   many calls, fresh data, ops and shapes alternating
    python loopback_worker.py time OUT.json     per-call wall time of a small ag-gemm
    python loopback_worker.py fail:V OUT.json   rank V dies before its call
    python loopback_worker.py failfast:V OUT.json  rank V dies after calls of the shape
                                                the others call next (their fast path)
    python loopback_worker.py tiledead:V OUT.json  failfast with a tile schedule (its GEMM
                                                spins on the victim's rows)
    python loopback_worker.py graphs OUT.json   ops captured in CUDA graphs, replayed on
                                                fresh data, eager calls in between
    python loopback_worker.py compile OUT.json  torch.compile(fullgraph=True) of ops
    python loopback_worker.py graphdead:V OUT.json  rank V dies while the others replay
    python loopback_worker.py grad OUT.json     each op's gradients (autograd) against fp32
                                                autograd of the whole job
    python loopback_worker.py tile OUT.json     `tile` schedules (FICCO_TEST_LOOPBACK_TILE=1),
                                                ops alternating, fresh data: on the fast path

Each rank writes its results to OUT.json as soon as it has them, so the test
can tell what happened even if the process does not end afterwards.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ficco.torch as ft

# Copy-engine schedules every op has on 2 and 4 GPUs (`ficco schedules`),
# then the automatic choice.
SCHEDULES = ["shard-copy-ring", "fine2-copy-all", "auto"]
OPS = {
    "ag-gemm": ft.all_gather_matmul,
    "gemm-rs": ft.matmul_reduce_scatter,
    "gemm-ar": ft.matmul_all_reduce,
}
# Rows per rank, k, n: large enough that the rule selector picks an
# overlapped copy-engine schedule (not `seq`, which needs NCCL) for "auto".
ROWS, K, N = 2048, 2048, 1024


def operands(op, case, q, world, shape=(ROWS, K, N)):
    """Rank q's inputs of case `case`, regenerated identically on any rank
    from a per-rank seed (no collective needed for the reference)."""
    rows_per, k, n = shape
    g = torch.Generator(device="cuda:0")
    g.manual_seed(1000 * case + q)
    rows = rows_per if op == "ag-gemm" else rows_per * world
    a = torch.randn(rows, k, device="cuda:0", generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda:0", generator=g).to(torch.bfloat16)
    return a, b


def reference(op, case, rank, world, shape=(ROWS, K, N)):
    """This rank's expected output, in fp32 from every rank's bf16 inputs."""
    ins = [operands(op, case, q, world, shape) for q in range(world)]
    if op == "ag-gemm":
        full = torch.cat([a.float() for a, _ in ins])
        return full @ ins[rank][1].float()
    total = sum(a.float() @ b.float() for a, b in ins)
    if op == "gemm-ar":
        return total
    m = shape[0] * world
    return total[rank * m // world:(rank + 1) * m // world]


def out_shape(op, world, shape=(ROWS, K, N)):
    m = shape[0] * world
    return (m // world if op == "gemm-rs" else m, shape[2])


def check(got, op, case, rank, world, shape, row):
    ref = reference(op, case, rank, world, shape)
    row["nan"] = bool(torch.isnan(got).any())
    row["err"] = float((got.float() - ref).norm() / ref.norm())


# Shapes (rows per rank, k, n) and schedules the repeat mode alternates.
REPEAT_SHAPES = [(256, 512, 384), (512, 256, 256)]
REPEAT_SCHEDULES = ["shard-copy-ring", "fine2-copy-all"]
# Calls issued back to back before their results are read (several calls
# in flight on the stream at once).
REPEAT_BATCH = 4
REPEAT_CALLS = 36


def run_repeat(rank, world, out_path):
    """Many calls, each with fresh random data, cycling through ops, shapes
    and schedules so that consecutive calls use different cached plans,
    issued in batches before their results are read; then repeated calls
    on ft.empty operands (in place), rewritten with fresh data between
    calls while the peers may still be at their previous call; then calls
    on two caller streams."""
    results = []
    ops = list(OPS)
    pending = []
    for i in range(REPEAT_CALLS):
        op = ops[i % 3]
        shape = REPEAT_SHAPES[(i // 3) % 2]
        schedule = REPEAT_SCHEDULES[(i // 6) % 2]
        case = 5000 + i
        a, b = operands(op, case, rank, world, shape)
        out = torch.full(out_shape(op, world, shape), float("nan"), dtype=torch.bfloat16, device="cuda:0")
        row = {"op": op, "schedule": schedule, "shape": list(shape), "call": i}
        try:
            with torch.no_grad():
                OPS[op](a, b, schedule=schedule, out=out)
            row["ran"] = ft.last_schedule()
            # The caller overwrites its inputs right away: its later work
            # on the stream follows the call.
            a.fill_(float("nan"))
            b.fill_(float("nan"))
            pending.append((row, out, op, case, shape))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
        if len(pending) == REPEAT_BATCH or i + 1 == REPEAT_CALLS:
            torch.cuda.synchronize()
            for prow, pout, pop, pcase, pshape in pending:
                check(pout, pop, pcase, rank, world, pshape, prow)
            pending = []
    # In place: the same shared operands, fresh data each call.
    shape = REPEAT_SHAPES[0]
    for op in ops:
        a0, b0 = operands(op, 7000, rank, world, shape)
        a = ft.empty(*a0.shape)
        b = ft.empty(*b0.shape)
        out = ft.empty(*out_shape(op, world, shape))
        for j in range(6):
            case = 7000 + 10 * ops.index(op) + j
            a0, b0 = operands(op, case, rank, world, shape)
            row = {"op": op, "schedule": "shard-copy-ring", "shape": list(shape), "in_place": True, "call": j}
            try:
                a.copy_(a0)
                b.copy_(b0)
                out.fill_(float("nan"))
                with torch.no_grad():
                    got = OPS[op](a, b, schedule="shard-copy-ring", out=out)
                row["ran"] = ft.last_schedule()
                snapshot = got.clone()
                torch.cuda.synchronize()
                check(snapshot, op, case, rank, world, shape, row)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            results.append(row)
        del a, b, out
    results += repeat_on_two_streams(rank, world)
    ft.synchronize()
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    ft.close()


# Calls per op alternating between two caller streams.
STREAM_CALLS = 8


def repeat_on_two_streams(rank, world):
    """Calls alternating between two caller streams, each stream with
    operands of its own at fixed addresses (so its calls replay their
    graphs), nothing ordering one stream after the other: ficco must keep
    this rank's calls in order itself."""
    rows = []
    shape = REPEAT_SHAPES[1]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for op in OPS:
        bufs = []
        for s in streams:
            with torch.cuda.stream(s):
                a0, b0 = operands(op, 9000, rank, world, shape)
                bufs.append((torch.empty_like(a0), torch.empty_like(b0),
                             torch.empty(out_shape(op, world, shape), dtype=torch.bfloat16, device="cuda:0")))
        torch.cuda.synchronize()
        pending = []
        for j in range(STREAM_CALLS):
            s = streams[j % 2]
            a, b, out = bufs[j % 2]
            case = 9000 + 100 * list(OPS).index(op) + j
            row = {"op": op, "schedule": "shard-copy-ring", "shape": list(shape), "stream": j % 2, "call": j}
            try:
                with torch.cuda.stream(s), torch.no_grad():
                    a0, b0 = operands(op, case, rank, world, shape)
                    a.copy_(a0)
                    b.copy_(b0)
                    out.fill_(float("nan"))
                    OPS[op](a, b, schedule="shard-copy-ring", out=out)
                    row["ran"] = ft.last_schedule()
                    pending.append((row, out.clone(), case))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
        torch.cuda.synchronize()
        for row, got, case in pending:
            check(got, op, case, rank, world, shape, row)
    return rows


# The timed shape: ag-gemm, m = 1024 over the ranks, k = n = 1024.
TIME_CALLS = 200


def run_time(rank, world, out_path):
    """Per-call wall time of a small ag-gemm, after warm-up: the host time
    of a loop of calls ended by one synchronize (what a model's forward
    pass sees), and of calls each synchronized."""
    m, k, n = 1024, 1024, 1024
    a = torch.randn(m // world, k, device="cuda:0").to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda:0").to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda:0")
    with torch.no_grad():
        for _ in range(10):
            ft.all_gather_matmul(a, b, schedule="shard-copy-ring", out=out)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(TIME_CALLS):
            ft.all_gather_matmul(a, b, schedule="shard-copy-ring", out=out)
        torch.cuda.synchronize()
        loop_us = (time.perf_counter() - t0) / TIME_CALLS * 1e6
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(TIME_CALLS // 4):
            ft.all_gather_matmul(a, b, schedule="shard-copy-ring", out=out)
            torch.cuda.synchronize()
        synced_us = (time.perf_counter() - t0) / (TIME_CALLS // 4) * 1e6
    row = {
        "sync_env": os.environ.get("FICCO_OP_SYNC", ""),
        "loop_us": loop_us,
        "synced_us": synced_us,
    }
    with open(out_path, "w") as fh:
        json.dump(row, fh)
    ft.close()


def check_result(row, got, out, op, case, rank, world):
    """Records in `row` what a call of `op` returned (`got`, given `out=`)
    against the reference of `case`, once the device finished it."""
    torch.cuda.synchronize()
    ref = reference(op, case, rank, world)
    row["ran"] = ft.last_schedule()
    row["same_tensor"] = got.data_ptr() == out.data_ptr()
    row["nan"] = bool(torch.isnan(got).any())
    row["err"] = float((got.float() - ref).norm() / ref.norm())


def run_ops(rank, world, out_path):
    results = []
    case = 0
    for op, f in OPS.items():
        for schedule in SCHEDULES:
            case += 1
            a, b = operands(op, case, rank, world)
            out = torch.full(out_shape(op, world), float("nan"), dtype=torch.bfloat16, device="cuda:0")
            row = {"op": op, "schedule": schedule}
            try:
                with torch.no_grad():
                    got = f(a, b, schedule=schedule, out=out)
                check_result(row, got, out, op, case, rank, world)
            except Exception as e:  # recorded; the test fails on it
                row["error"] = f"{type(e).__name__}: {e}"
            results.append(row)
            with open(out_path, "w") as fh:
                json.dump(results, fh)
    # The same ops on tensors from ft.empty: used in place, not copied.
    for op, f in OPS.items():
        case += 1
        a0, b0 = operands(op, case, rank, world)
        row = {"op": op, "schedule": "shard-copy-ring", "in_place": True}
        try:
            a = ft.empty(*a0.shape)
            b = ft.empty(*b0.shape)
            out = ft.empty(*out_shape(op, world))
            a.copy_(a0)
            b.copy_(b0)
            out.fill_(float("nan"))
            with torch.no_grad():
                got = f(a, b, schedule="shard-copy-ring", out=out)
            check_result(row, got, out, op, case, rank, world)
            del a, b, out, got
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
        with open(out_path, "w") as fh:
            json.dump(results, fh)
    # Operands that start off 16 bytes (views 2 bytes into their storage):
    # ficco binds operands in place, so Python hands it aligned copies and
    # copies the result back into `out`.
    for op, f in OPS.items():
        case += 1
        a0, b0 = operands(op, case, rank, world)
        row = {"op": op, "schedule": "shard-copy-ring", "misaligned": True}

        def off(t):
            v = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
            return v.copy_(t)

        try:
            a, b = off(a0), off(b0)
            out = off(torch.full(out_shape(op, world), float("nan"), dtype=torch.bfloat16, device="cuda:0"))
            assert a.data_ptr() % 16 and out.data_ptr() % 16
            with torch.no_grad():
                got = f(a, b, schedule="shard-copy-ring", out=out)
            check_result(row, got, out, op, case, rank, world)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
        with open(out_path, "w") as fh:
            json.dump(results, fh)
    ft.close()


GRAPH_SHAPE = (256, 512, 384)
GRAPH_SCHEDULE = "shard-copy-ring"


def graph_case(op, replay):
    return 9000 + 10 * replay + list(OPS).index(op)


def static_operands(op, world, shape=GRAPH_SHAPE):
    a0, b0 = operands(op, 0, 0, world, shape)
    out = torch.empty(out_shape(op, world, shape), dtype=torch.bfloat16, device="cuda:0")
    return a0.clone(), b0.clone(), out


def capture(calls):
    """A CUDA graph of `calls` (each a thunk), after one eager warm-up of
    each (what the README asks for before capture)."""
    with torch.no_grad():
        for c in calls:
            c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def run_graphs(rank, world, out_path):
    """One graph holding a call of each op (an odd number of calls: the
    barrier banks must come back as they were), replayed on fresh data
    copied into its static inputs, with an eager call (of another shape)
    between replays; then a capture of a shape never run eagerly, which
    must be refused with what to do, leaving the job usable."""
    results = []
    static = {op: static_operands(op, world) for op in OPS}

    def call(op):
        a, b, out = static[op]
        return lambda: OPS[op](a, b, schedule=GRAPH_SCHEDULE, out=out)

    g = capture([call(op) for op in OPS])
    eager_shape = REPEAT_SHAPES[1]
    for j in range(4):
        for op in OPS:
            a, b, out = static[op]
            a0, b0 = operands(op, graph_case(op, j), rank, world, GRAPH_SHAPE)
            a.copy_(a0)
            b.copy_(b0)
            out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for op in OPS:
            row = {"op": op, "replay": j}
            check(static[op][2], op, graph_case(op, j), rank, world, GRAPH_SHAPE, row)
            results.append(row)
        # An eager call between replays (one call: an odd count).
        ea, eb = operands("gemm-rs", 9500 + j, rank, world, eager_shape)
        with torch.no_grad():
            got = ft.matmul_reduce_scatter(ea, eb, schedule=GRAPH_SCHEDULE)
        torch.cuda.synchronize()
        row = {"op": "gemm-rs", "eager_between": j}
        check(got, "gemm-rs", 9500 + j, rank, world, eager_shape, row)
        results.append(row)
    # A shape never run eagerly cannot be captured: refused, job intact.
    a, b = operands("ag-gemm", 9900, rank, world, (128, 256, 128))
    row = {"refused": None}
    g2 = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(g2):
            ft.all_gather_matmul(a, b, schedule=GRAPH_SCHEDULE)
    except Exception as e:
        row = {"refused": type(e).__name__, "message": str(e)}
    results.append(row)
    torch.cuda.synchronize()
    with torch.no_grad():
        got = ft.all_gather_matmul(a, b, schedule=GRAPH_SCHEDULE)
    torch.cuda.synchronize()
    row = {"op": "ag-gemm", "after_refusal": True}
    check(got, "ag-gemm", 9900, rank, world, (128, 256, 128), row)
    results.append(row)
    ft.synchronize()
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    ft.close()


def run_compile(rank, world, out_path):
    """torch.compile(fullgraph=True) of ag-gemm, an activation and gemm-rs:
    ficco's ops are custom ops in the graph (no break); the compiled output
    equals the eager one."""
    shape = GRAPH_SHAPE
    a, b = operands("ag-gemm", 9700, rank, world, shape)
    g = torch.Generator(device="cuda:0")
    g.manual_seed(9701)
    w = (torch.randn(shape[2], shape[1], device="cuda:0", generator=g) / 16).to(torch.bfloat16)

    def f(x, w1, w2):
        h = ft.all_gather_matmul(x, w1, schedule=GRAPH_SCHEDULE)
        return ft.matmul_reduce_scatter(torch.relu(h), w2, schedule=GRAPH_SCHEDULE)

    breaks = []

    def backend(gm, example_inputs):
        breaks.append(sum(1 for n in gm.graph.nodes if "ficco" in str(n.target)))
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    with torch.no_grad():
        want = f(a, b, w)
        got = torch.compile(f, backend=backend, fullgraph=True)(a, b, w)
        got2 = torch.compile(f, backend=backend, fullgraph=True)(a, b, w)
    torch.cuda.synchronize()
    row = {
        "graphs": len(breaks),
        "ficco_nodes": breaks,
        "equal": bool(torch.equal(got, want)) and bool(torch.equal(got2, want)),
        "nan": bool(torch.isnan(got).any()),
    }
    with open(out_path, "w") as fh:
        json.dump(row, fh)
    ft.close()


def after_victim_dies(rank, victim, out_path, call):
    """Every rank past a barrier; the victim exits, the others run `call`
    (which must raise because the victim is gone) and write whether and
    when it raised."""
    dist.barrier()
    if rank == victim:
        os._exit(3)
    t0 = time.monotonic()
    try:
        call()
        row = {"raised": None}
    except Exception as e:
        row = {"raised": type(e).__name__, "message": str(e)}
    row["after_s"] = time.monotonic() - t0
    with open(out_path, "w") as fh:
        json.dump(row, fh)


def run_graphdead(rank, world, victim, out_path):
    """The ops captured in a graph and replayed; then the victim dies and
    the others replay again: the watch thread releases their streams and
    ft.synchronize() raises within ficco's bound."""
    static = {op: static_operands(op, world) for op in ("ag-gemm", "gemm-rs")}
    g = capture([
        (lambda op=op: OPS[op](static[op][0], static[op][1], schedule=GRAPH_SCHEDULE, out=static[op][2]))
        for op in static
    ])
    g.replay()
    torch.cuda.synchronize()

    def replay():
        g.replay()
        torch.cuda.synchronize()
        ft.synchronize()

    after_victim_dies(rank, victim, out_path, replay)


def run_fail(rank, world, victim, out_path):
    a, b = operands("ag-gemm", 1, rank, world)
    with torch.no_grad():
        ft.all_gather_matmul(a, b, schedule="shard-copy-ring")
    torch.cuda.synchronize()
    # Everybody has joined the session and finished a call.
    a, b = operands("gemm-rs", 2, rank, world)

    def call():
        with torch.no_grad():
            ft.matmul_reduce_scatter(a, b, schedule="shard-copy-ring")
        torch.cuda.synchronize()

    after_victim_dies(rank, victim, out_path, call)


def run_failfast(rank, world, victim, out_path, schedule="shard-copy-ring"):
    """Every rank runs the same shape a few times (its later calls take the
    fast path); then the victim dies and the others call that shape again:
    the call returns before it runs, its stream is released by ficco's
    watch thread, and the hang is raised by ft.synchronize(). With
    `tile-copy-ring` the GEMM's blocks spin on rows the victim never
    pushes until the watch releases every flag."""
    shape = TILE_SHAPE if schedule.startswith("tile") else (ROWS, K, N)
    a, b = operands("ag-gemm", 1, rank, world, shape)
    with torch.no_grad():
        for _ in range(3):
            ft.all_gather_matmul(a, b, schedule=schedule)
    torch.cuda.synchronize()

    def call():
        with torch.no_grad():
            ft.all_gather_matmul(a, b, schedule=schedule)
        torch.cuda.synchronize()
        ft.synchronize()

    after_victim_dies(rank, victim, out_path, call)


# Gradients: rows per rank, k, n (the input gradients run the other op on
# ficco, m x n x k).
GRAD_SHAPE = (1024, 1024, 768)


def grad_reference(op, rank, world, shape=GRAD_SHAPE):
    """fp32 gradients of the job's loss (the sum of every rank's
    sum(w_q * c_q); gemm-ar: rank 0's loss of the replicated output) with
    respect to this rank's a and b."""
    ins = [operands(op, 9000, q, world, shape) for q in range(world)]
    a = [x.float().requires_grad_() for x, _ in ins]
    b = [y.float().requires_grad_() for _, y in ins]
    ws = [grad_weights(op, q, world, shape).float() for q in range(world)]
    if op == "ag-gemm":
        full = torch.cat(a)
        loss = sum((ws[q] * (full @ b[q])).sum() for q in range(world))
    else:
        total = sum(a[q] @ b[q] for q in range(world))
        if op == "gemm-ar":
            loss = (ws[0] * total).sum()
        else:
            rows = total.shape[0] // world
            loss = sum((ws[q] * total[q * rows:(q + 1) * rows]).sum() for q in range(world))
    loss.backward()
    return a[rank].grad, b[rank].grad


def grad_weights(op, q, world, shape=GRAD_SHAPE):
    g = torch.Generator(device="cuda:0")
    g.manual_seed(9500 + q)
    return torch.randn(out_shape(op, world, shape), device="cuda:0", generator=g).to(torch.bfloat16)


def run_grad(rank, world, out_path):
    results = []
    for op, f in OPS.items():
        row = {"op": op}
        try:
            a0, b0 = operands(op, 9000, rank, world, GRAD_SHAPE)
            a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
            w = grad_weights(op, 0 if op == "gemm-ar" else rank, world)
            c = f(a, b)
            (w.float() * c.float()).sum().backward()
            torch.cuda.synchronize()
            want_a, want_b = grad_reference(op, rank, world)
            for name, got, want in (("a", a.grad, want_a), ("b", b.grad, want_b)):
                row[f"nan_{name}"] = bool(torch.isnan(got).any())
                row[f"err_{name}"] = float((got.float() - want).norm() / want.norm())
            row["ran"] = ft.last_schedule()
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
    ft.synchronize()
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    ft.close()


# tile schedules need shards of whole 128-row blocks on 4 ranks.
TILE_SHAPE = (512, 1024, 512)
TILE_SCHEDULES = ["tile-copy-ring", "tile-copy-all"]
TILE_ROUNDS = 4


def run_tile(rank, world, out_path):
    """`tile` schedules of every op (and `-acc` on 2 ranks), the (op,
    schedule) pairs called in turn for several rounds, fresh data each
    call; each pair writes into one of two outputs kept from round to round
    (so later calls find their addresses, and `-acc` its tables, again) and
    the caller overwrites its inputs right after the call. Then the native
    host phases: how many calls took the full path (each call shape's first
    only, if tile plans run fast); then a captured gemm-rs tile call
    replayed on fresh data, and a captured ag-gemm one, which is refused."""
    results = []
    pairs = [(op, s) for op in OPS for s in TILE_SCHEDULES]
    outs = {
        (op, s): [torch.empty(out_shape(op, world, TILE_SHAPE), dtype=torch.bfloat16, device="cuda:0")
                  for _ in range(2)]
        for op, s in pairs
    }
    if world == 2:
        # `-acc` (2 GPUs only): the own block goes straight into the output
        # through a table of its addresses; outputs in shared memory, at two
        # addresses, so the call shape keeps two tables.
        for op, s in [("gemm-rs", "tile-copy-ring-acc"), ("gemm-ar", "tile-copy-all-acc")]:
            pairs.append((op, s))
            outs[(op, s)] = [ft.empty(*out_shape(op, world, TILE_SHAPE)) for _ in range(2)]
    type(ft.session()).host_times()
    for i in range(TILE_ROUNDS * len(pairs)):
        op, schedule = pairs[i % len(pairs)]
        out = outs[(op, schedule)][(i // len(pairs)) % 2]
        case = 11000 + i
        row = {"op": op, "schedule": schedule, "shape": list(TILE_SHAPE), "call": i}
        try:
            a, b = operands(op, case, rank, world, TILE_SHAPE)
            out.fill_(float("nan"))
            with torch.no_grad():
                OPS[op](a, b, schedule=schedule, out=out)
            row["ran"] = ft.last_schedule()
            a.fill_(float("nan"))
            b.fill_(float("nan"))
            got = out.clone()
            check(got, op, case, rank, world, TILE_SHAPE, row)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        results.append(row)
    ft.synchronize()
    phases = {phase: count for phase, _, count in type(ft.session()).host_times()}
    # A captured gemm-rs tile call (its GEMM waits on no flag) replays on
    # fresh data; a captured ag-gemm one (its GEMM waits on the pushed rows)
    # is refused before anything runs.
    captured = []
    a_s, b_s, out_s = static_operands("gemm-rs", world, TILE_SHAPE)
    try:
        g = capture([lambda: ft.matmul_reduce_scatter(a_s, b_s, schedule="tile-copy-ring", out=out_s)])
        for j in range(3):
            case = 12500 + j
            a0, b0 = operands("gemm-rs", case, rank, world, TILE_SHAPE)
            a_s.copy_(a0)
            b_s.copy_(b0)
            out_s.fill_(float("nan"))
            g.replay()
            row = {"op": "gemm-rs", "schedule": "tile-copy-ring", "replay": j}
            check(out_s.clone(), "gemm-rs", case, rank, world, TILE_SHAPE, row)
            captured.append(row)
        torch.cuda.synchronize()
        del g
    except Exception as e:
        captured.append({"error": f"{type(e).__name__}: {e}"})
    op, schedule = pairs[0]
    a, b = operands(op, 12000, rank, world, TILE_SHAPE)
    out = outs[(op, schedule)][0]
    refusal = None
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g), torch.no_grad():
            OPS[op](a, b, schedule=schedule, out=out)
    except Exception as e:
        refusal = f"{type(e).__name__}: {e}"
    results.append({"phases": phases, "calls": TILE_ROUNDS * len(pairs), "shapes": len(pairs),
                    "capture": refusal, "captured": captured})
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    ft.close()


def main():
    mode, out_path = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="env://")
    plain = {"ops": run_ops, "repeat": run_repeat, "time": run_time, "graphs": run_graphs,
             "compile": run_compile, "grad": run_grad, "tile": run_tile}
    if mode in plain:
        plain[mode](rank, world, out_path)
        dist.destroy_process_group()
    elif mode.startswith("graphdead:"):
        run_graphdead(rank, world, int(mode[10:]), out_path)
    elif mode.startswith("failfast:"):
        run_failfast(rank, world, int(mode[9:]), out_path)
    elif mode.startswith("tiledead:"):
        run_failfast(rank, world, int(mode[9:]), out_path, schedule="tile-copy-ring")
    elif mode.startswith("fail:"):
        # Exits normally after raising: that the process then ends (ficco's
        # atexit hook, the dropped session) is part of what is tested.
        run_fail(rank, world, int(mode[5:]), out_path)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
