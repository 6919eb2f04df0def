"""The Python ops on one GPU: 2 and 4 ranks as processes, all on cuda:0
(loopback), with a gloo process group, against an fp32 reference; and a rank
that dies: the others raise instead of hanging.

Skipped without CUDA, unless FICCO_REQUIRE_GPU=1, where that fails. Run on
a GPU machine with:

    pytest -q python/tests/test_gpu_loopback.py
    python python/tests/test_gpu_loopback.py [ops|repeat|time|dead|graphs|grad|tile]   # without pytest

`time` prints the per-call wall time of a small ag-gemm on 2 ranks, with
the fast path and with FICCO_OP_SYNC=1 (the full path on every call).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import ficco

try:
    import pytest
except ImportError:  # run as a script (see __main__ below)
    pytest = None

WORKER = Path(__file__).resolve().parent / "loopback_worker.py"

if not torch.cuda.is_available():
    if os.environ.get("FICCO_REQUIRE_GPU") == "1":
        raise RuntimeError("FICCO_REQUIRE_GPU=1 but torch sees no CUDA device")
    if pytest is not None and __name__ != "__main__":
        pytest.skip("no CUDA device (set FICCO_REQUIRE_GPU=1 to fail instead)", allow_module_level=True)

# bf16 output of a bf16 GEMM (and a sum over ranks): relative Frobenius
# error of a correct result is ~3e-3; a wrong block or a missing peer is ~1.
TOLERANCE = 2e-2


def launch(world, mode, tmp_path, limit_s, extra_env=None):
    """Starts `world` ranks of the worker; returns (exit codes, seconds until
    the last one ended, each rank's JSON or None). Ranks still running after
    `limit_s` are killed (their code is then None)."""
    port = ficco.free_port()
    base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "NCCL_NVLS_ENABLE": "0",
        **(extra_env or {}),
    }
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, str(outs[r])],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(world)
    ]
    codes = [None] * world
    while any(c is None for c in codes) and time.monotonic() - t0 < limit_s:
        for r, p in enumerate(procs):
            if codes[r] is None:
                codes[r] = p.poll()
        time.sleep(0.1)
    ended = time.monotonic() - t0
    for r, p in enumerate(procs):
        if codes[r] is None:
            p.kill()
            p.wait()
    results = [json.loads(o.read_text()) if o.exists() else None for o in outs]
    return codes, ended, results


def check_ops(world, tmp_path):
    codes, _, results = launch(
        world, "ops", tmp_path, limit_s=500, extra_env={"FICCO_DIST_TIMEOUT_MS": "60000"}
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    failures = []
    for rank, rows in enumerate(results):
        assert rows is not None and len(rows) == 15, f"rank {rank}: {rows}"
        for row in rows:
            what = f"rank {rank} {row['op']} schedule={row['schedule']}"
            if "error" in row:
                failures.append(f"{what}: {row['error']}")
                continue
            if row["nan"]:
                failures.append(f"{what}: NaN left in the output (not every element written)")
            if not row["err"] < TOLERANCE:
                failures.append(f"{what} (ran {row['ran']}): relative error {row['err']:.3g}")
            if not row["same_tensor"]:
                failures.append(f"{what}: the result is not the out= tensor")
            want = row["schedule"]
            if want != "auto" and row["ran"] != want:
                failures.append(f"{what}: ran {row['ran']} instead")
            if want == "auto" and not row["ran"]:
                failures.append(f"{what}: no schedule name reported")
    assert not failures, "\n".join(failures)
    # "auto" made the same choice on every rank.
    for i in range(15):
        assert len({rows[i]["ran"] for rows in results}) == 1, [rows[i] for rows in results]


def forced_call_failures(what, row):
    """What is wrong with one checked call of a named schedule (`what`
    names it): an error, NaN left in the output, a relative error over
    the tolerance, or another schedule run."""
    if "error" in row:
        return [f"{what}: {row['error']}"]
    out = []
    if row["nan"]:
        out.append(f"{what}: NaN left in the output")
    if not row["err"] < TOLERANCE:
        out.append(f"{what}: relative error {row['err']:.3g}")
    if row["ran"] != row["schedule"]:
        out.append(f"{what}: ran {row['ran']}")
    return out


def check_repeat(world, tmp_path):
    codes, _, results = launch(
        world, "repeat", tmp_path, limit_s=500, extra_env={"FICCO_DIST_TIMEOUT_MS": "60000"}
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    failures = []
    for rank, rows in enumerate(results):
        assert rows is not None and len(rows) == 36 + 18 + 24, f"rank {rank}: {rows}"
        for row in rows:
            what = f"rank {rank} call {row['call']} {row['op']} {row['shape']} {row['schedule']}"
            what += " in place" if row.get("in_place") else ""
            what += f" on stream {row['stream']}" if "stream" in row else ""
            failures += forced_call_failures(what, row)
    assert not failures, "\n".join(failures)


def check_tile(world, tmp_path):
    """`tile` schedules on the op path (the test setting lets them run in
    loopback, time-sliced): exact, every call after its shape's first on
    the stream-ordered path; a captured gemm-rs one replays exactly, and a
    captured ag-gemm one (its GEMM waits on flags) is refused with a clear
    error."""
    codes, _, results = launch(
        world, "tile", tmp_path, limit_s=500,
        extra_env={"FICCO_DIST_TIMEOUT_MS": "60000", "FICCO_TEST_LOOPBACK_TILE": "1"},
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    failures = []
    for rank, rows in enumerate(results):
        assert rows is not None and "phases" in rows[-1], f"rank {rank}: {rows}"
        summary, rows = rows[-1], rows[:-1]
        for row in rows:
            what = f"rank {rank} call {row['call']} {row['op']} {row['schedule']}"
            failures += forced_call_failures(what, row)
        phases = summary["phases"]
        full = phases.get("full", 0)
        fast = sum(phases.get(p, 0) for p in ("issue", "capture", "launch"))
        if full != summary["shapes"] or fast != summary["calls"] - summary["shapes"]:
            failures.append(
                f"rank {rank}: {full} full and {fast} fast calls of {summary['calls']} "
                f"({summary['shapes']} shapes): {phases}"
            )
        for row in summary["captured"]:
            if "error" in row:
                failures.append(f"rank {rank}: a captured gemm-rs tile call: {row['error']}")
            elif row["nan"] or not row["err"] < TOLERANCE:
                failures.append(f"rank {rank}: a captured gemm-rs tile call, replay {row['replay']}: {row}")
        if len(summary["captured"]) != 3:
            failures.append(f"rank {rank}: {len(summary['captured'])} replays of the captured gemm-rs tile call")
        refusal = summary["capture"] or ""
        if not (refusal.startswith("ValueError") and "tile GEMM" in refusal):
            failures.append(f"rank {rank}: a captured tile call was not refused as expected: {refusal!r}")
        print(f"tile world={world} rank {rank}: phases {phases}", flush=True)
    assert not failures, "\n".join(failures)


def check_time(world, tmp_path):
    """Prints the per-call wall time, fast path against FICCO_OP_SYNC=1."""
    rows = {}
    for label, env in (("fast", {}), ("FICCO_OP_SYNC=1", {"FICCO_OP_SYNC": "1"})):
        d = tmp_path / label.replace("=", "_")
        d.mkdir()
        codes, _, results = launch(world, "time", d, limit_s=300, extra_env=env)
        assert codes == [0] * world, f"{label}: exit codes {codes}; results {results}"
        rows[label] = results
        loop = max(r["loop_us"] for r in results)
        synced = max(r["synced_us"] for r in results)
        print(
            f"ag-gemm m=1024 k=1024 n=1024, {world} loopback ranks, {label}: "
            f"{loop:.0f} us per call in a loop, {synced:.0f} us per call synchronized "
            f"(max over ranks)",
            flush=True,
        )
    return rows


def check_dead_rank(world, victim, mode, tmp_path):
    """`mode`: "fail" (the victim dies in a call's full path), "failfast"
    (in its fast path), "tiledead" (the same with a tile GEMM spinning on
    the victim's rows) or "graphdead" (while the others replay a graph).
    `tmp_path` last, as every check takes it."""
    codes, ended, results = launch(
        world,
        f"{mode}:{victim}",
        tmp_path,
        limit_s=90,
        extra_env={"FICCO_DIST_TIMEOUT_MS": "10000", "FICCO_WATCHDOG_MS": "5000",
                   "FICCO_TEST_LOOPBACK_TILE": "1"},
    )
    assert codes[victim] == 3, f"the victim's exit code {codes[victim]}; all {codes}"
    for r in range(world):
        if r == victim:
            continue
        row = results[r]
        assert row is not None, f"rank {r} never got past the call (exit code {codes[r]})"
        assert row["raised"] == "RuntimeError", f"rank {r}: {row}"
        assert row["message"], f"rank {r}: an empty message"
        # Within ficco's bounds (10 s rendezvous, 5 s watchdog) plus slack.
        assert row["after_s"] < 40, f"rank {r} raised only after {row['after_s']:.1f} s"
        assert codes[r] == 0, f"rank {r} exited with {codes[r]} after raising"
    assert ended < 60, f"the processes ended only after {ended:.1f} s (codes {codes})"


def check_graphs(world, tmp_path):
    """Captured calls replay correctly on fresh data, also with eager calls
    between replays; a capture that needs set-up is refused with what to
    do, and the job goes on."""
    codes, _, results = launch(
        world, "graphs", tmp_path, limit_s=300, extra_env={"FICCO_DIST_TIMEOUT_MS": "60000"}
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    failures = []
    for rank, rows in enumerate(results):
        assert rows is not None and len(rows) == 4 * 4 + 2, f"rank {rank}: {rows}"
        for row in rows:
            if "refused" in row:
                if row["refused"] != "ValueError" or "eagerly" not in row.get("message", ""):
                    failures.append(f"rank {rank}: the capture of a new shape was not refused as asked: {row}")
                continue
            if row["nan"] or not row["err"] < TOLERANCE:
                failures.append(f"rank {rank} {row}: wrong result")
    assert not failures, "\n".join(failures)


def check_compile(world, tmp_path):
    codes, _, results = launch(
        world, "compile", tmp_path, limit_s=300, extra_env={"FICCO_DIST_TIMEOUT_MS": "60000"}
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    for rank, row in enumerate(results):
        assert row is not None, f"rank {rank} wrote nothing"
        # One graph (fullgraph: no break), with both ficco ops in it.
        assert row["graphs"] == 1 and row["ficco_nodes"] == [2], f"rank {rank}: {row}"
        assert row["equal"] and not row["nan"], f"rank {rank}: compiled != eager: {row}"


def check_grad(world, tmp_path):
    """Each op's gradients, through autograd and ficco's backward ops,
    against fp32 autograd of the whole job."""
    codes, _, results = launch(
        world, "grad", tmp_path, limit_s=300, extra_env={"FICCO_DIST_TIMEOUT_MS": "60000"}
    )
    assert codes == [0] * world, f"exit codes {codes}; results {results}"
    for rank, rows in enumerate(results):
        assert rows is not None, f"rank {rank} wrote nothing"
        assert len(rows) == 3, rows
        for row in rows:
            assert "error" not in row, f"rank {rank}: {row}"
            assert not row["nan_a"] and not row["nan_b"], f"rank {rank}: {row}"
            assert row["err_a"] < TOLERANCE and row["err_b"] < TOLERANCE, f"rank {rank}: {row}"


def check_graph_dead(world, victim, tmp_path):
    """The same ending during graph replays (the device marks each call's
    start and end; no host code runs per replay)."""
    check_dead_rank(world, victim, "graphdead", tmp_path)


OPS_CASES = [2, 4]
# Rank 0 (which hosts the session's store) dying, and another rank; in a
# call's full path ("fail") and in its fast path ("failfast", and
# "tiledead" with a tile GEMM).
DEAD_CASES = [(2, 0, "fail"), (4, 2, "fail"), (2, 1, "failfast"), (4, 0, "failfast"),
              (2, 1, "tiledead"), (4, 3, "tiledead")]

if pytest is not None:

    @pytest.mark.parametrize("world", OPS_CASES)
    def test_every_op_equals_the_reference(world, tmp_path):
        check_ops(world, tmp_path)

    @pytest.mark.parametrize("world", OPS_CASES)
    def test_repeated_calls_alternating_shapes_equal_the_reference(world, tmp_path):
        check_repeat(world, tmp_path)

    def test_per_call_time_is_printed(tmp_path):
        check_time(2, tmp_path)

    @pytest.mark.parametrize("world", OPS_CASES)
    def test_captured_calls_replay_on_fresh_data(world, tmp_path):
        check_graphs(world, tmp_path)

    def test_compiled_ops_equal_eager(tmp_path):
        check_compile(2, tmp_path)

    @pytest.mark.parametrize("world", OPS_CASES)
    def test_gradients_equal_fp32_autograd(world, tmp_path):
        check_grad(world, tmp_path)

    @pytest.mark.parametrize("world", OPS_CASES)
    def test_tile_schedules_take_the_fast_path(world, tmp_path):
        check_tile(world, tmp_path)

    def test_a_dead_rank_ends_graph_replays_with_an_error(tmp_path):
        check_graph_dead(4, 1, tmp_path)

    @pytest.mark.parametrize("world,victim,mode", DEAD_CASES)
    def test_a_dead_rank_ends_the_others_with_an_error(world, victim, mode, tmp_path):
        check_dead_rank(world, victim, mode, tmp_path)


if __name__ == "__main__":
    import tempfile
    import traceback

    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        sys.exit(0)
    # `python test_gpu_loopback.py [ops|repeat|time|dead|graphs|grad|tile]`: one half (each well within a 10-minute call).
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    cases = [(f"ops world={w}", check_ops, (w,)) for w in OPS_CASES if only in ("", "ops")]
    cases += [(f"repeat world={w}", check_repeat, (w,)) for w in OPS_CASES if only in ("", "repeat")]
    cases += [("time world=2", check_time, (2,))] if only in ("", "time") else []
    cases += [(f"dead rank world={w} victim={v} ({mode})", check_dead_rank, (w, v, mode))
              for w, v, mode in DEAD_CASES if only in ("", "dead")]
    cases += [(f"graphs world={w}", check_graphs, (w,)) for w in OPS_CASES if only in ("", "graphs")]
    cases += [("compile world=2", check_compile, (2,))] if only in ("", "graphs") else []
    cases += [(f"grad world={w}", check_grad, (w,)) for w in OPS_CASES if only in ("", "grad")]
    cases += [(f"tile world={w}", check_tile, (w,)) for w in OPS_CASES if only in ("", "tile")]
    cases += [("graph replay, dead rank world=4 victim=1", check_graph_dead, (4, 1))] if only in ("", "graphs") else []
    failed = 0
    for name, fn, args in cases:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            try:
                fn(*args, Path(d))
                print(f"PASS {name} ({time.monotonic() - t0:.1f} s)", flush=True)
            except AssertionError:
                failed += 1
                print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
    print(f"{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
