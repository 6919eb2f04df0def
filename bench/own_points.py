#!/usr/bin/env python3
"""Prints the `source` and `points` of the `[own_gemm]` block of a hardware profile from a `ficco gemm-bench
--save` JSON: one point per measured shape, [M, N, K, ficco TFLOP/s, cuBLASLt
(autotuned) TFLOP/s], where ficco's figure is its autotuned pick (the schedule
the executor launches). The profile's `stage_slowdown` (-occS) stays as it is:
the hook rows' `stages=S` settings vary the chooser's tile, which differs by shape.

Usage: python3 bench/own_points.py GEMM.json "SOURCE TEXT" > block.toml
"""
import json
import sys


def main() -> None:
    path, source = sys.argv[1], sys.argv[2]
    report = json.load(open(path))
    out = [f'source = "{source}"']
    out.append("# [M, N, K, ficco TFLOP/s (autotuned pick), cuBLASLt (autotuned) TFLOP/s]")
    out.append("points = [")
    seen = set()
    for r in report["rows"]:
        key = (r["m"], r["n"], r["k"])
        if key in seen or not r.get("auto_ms"):
            continue
        seen.add(key)
        ours = 2.0 * r["m"] * r["n"] * r["k"] / (r["auto_ms"] * 1e-3) / 1e12
        out.append(f"  [{r['m']}, {r['n']}, {r['k']}, {ours:.1f}, {r['tuned_tflops']:.1f}],")
    out.append("]")
    print("\n".join(out))


if __name__ == "__main__":
    main()
