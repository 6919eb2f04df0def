#!/usr/bin/env python3
"""Fits a hardware profile's global values to stored measurements, by
coordinate search: each value in turn is scaled by a few factors and kept
at the one of least mean absolute percentage error (MAPE) over the fit
rows, for a few rounds. Rows of scenarios matching ``--hold-out`` are never
fitted on; their MAPE is reported beside.

    python3 bench/fit_profile.py crates/ficco-core/profiles/h200-nvlink.toml \\
        crates/ficco-core/tests/data/soak-h100x4-b405ac2.json --hold-out llama3-8b \\
        --set hbm_gbs=3350 --out /tmp/h100.toml

A value is named ``SECTION.KEY`` (``gemm.sustained_tflops``; ``.KEY`` for
the top level), or ``SECTION:KIND:GPUS.KEY`` for an entry of
``[[nccl.collective]]`` (``nccl.collective:all-gather:4.bus_gbs``), or
``SECTION::GPUS.KEY`` for ``[[nccl.p2p]]``. The profile's text is edited in
place (comments kept); predictions come from ``ficco explore --backend
sim --suite``.
"""

import argparse
import json
import math
import os
import re
import subprocess
import tempfile

FIT = [
    "gemm.sustained_tflops", "gemm.k_overhead", "gemm.fixed_us", ".launch_us",
    "contention.gemm_slowdown_nccl", "contention.gemm_slowdown_copy",
    "contention.nccl_slowdown_gemm", "contention.copy_slowdown_gemm",
    "nccl.collective:all-gather:2.bus_gbs", "nccl.collective:all-gather:4.bus_gbs",
    "nccl.collective:reduce-scatter:2.bus_gbs", "nccl.collective:reduce-scatter:4.bus_gbs",
    "nccl.collective:all-reduce:2.bus_gbs", "nccl.collective:all-reduce:4.bus_gbs",
    "nccl.p2p_bus_gbs", "nccl.p2p_peer_gbs", "nccl.p2p::4.peer_gbs",
    "reduce.launch_us", "nvlink.flag_wait_us", "copy_engine.latency_us",
]
FACTORS = (0.88, 0.94, 0.97, 1.03, 1.06, 1.12)


def blocks(text):
    """(label, start, end) of each table of the TOML text: '' for the top
    level, 'gemm', 'nccl.collective:all-gather:4', 'nccl.p2p::4'."""
    lines = text.split("\n")
    heads = [i for i, l in enumerate(lines) if re.match(r"^\[\[?[a-z_.]+\]\]?\s*$", l)]
    spans = [(0, heads[0] if heads else len(lines))]
    spans += [(h, heads[j + 1] if j + 1 < len(heads) else len(lines)) for j, h in enumerate(heads)]
    out = []
    for s, e in spans:
        if s == 0 and (not heads or heads[0] != 0):
            label = ""
        else:
            label = lines[s].strip("[] ")
            body = "\n".join(lines[s:e])
            kind = re.search(r'^kind\s*=\s*"([^"]+)"', body, re.M)
            gpus = re.search(r"^gpus\s*=\s*(\d+)", body, re.M)
            if lines[s].startswith("[["):
                label += f":{kind.group(1) if kind else ''}:{gpus.group(1) if gpus else ''}"
        out.append((label, s, e))
    return lines, out


def locate(text, name):
    """The line index of value `name` and its current value."""
    where, key = name.rsplit(".", 1)
    lines, bl = blocks(text)
    for label, s, e in bl:
        if label == where:
            for i in range(s, e):
                m = re.match(rf"^{re.escape(key)}\s*=\s*([-0-9.eE]+)\s*(#.*)?$", lines[i])
                if m:
                    return i, float(m.group(1))
    raise SystemExit(f"fit_profile: no value {name} in the profile")


def set_value(text, name, value):
    i, _ = locate(text, name)
    lines = text.split("\n")
    key = name.rsplit(".", 1)[1]
    lines[i] = f"{key} = {value:.6g}"
    return "\n".join(lines)


def suite(rows, path):
    with open(path, "w") as f:
        for s in rows:
            f.write(f'[[scenario]]\nname = "{s["scenario"]}"\nop = "{s["op"]}"\nm = {s["m"]}\n'
                    f'k = {s["k"]}\nn = {s["n"]}\ngpus = {s["gpus"]}\n\n')


def predict(ficco, profile_text, suite_path, tmp):
    path = os.path.join(tmp, "profile.toml")
    with open(path, "w") as f:
        f.write(profile_text)
    # --controls: the measured rows may hold any schedule (`-hi` in a soak).
    run = subprocess.run([ficco, "explore", "--backend", "sim", "--hw", path, "--suite", suite_path,
                          "--controls", "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        return None  # the profile refuses the value (e.g. a slowdown below 1)
    out = run.stdout
    return {sc["scenario"]: {x["name"]: x.get("predicted_ms") for x in sc["schedules"]}
            for sc in json.loads(out)["scenarios"]}


def errors(rows, pred):
    """MAPE per (held out?, P) over the rows with a prediction."""
    acc = {}
    for s in rows:
        p = pred[s["scenario"]]
        for name, t in s["times_ms"].items():
            if p.get(name) and t > 0:
                key = (s["held"], s["gpus"])
                a = acc.setdefault(key, [0.0, 0])
                a[0] += abs(p[name] / t - 1)
                a[1] += 1
    return {k: v[0] / v[1] for k, v in acc.items()}, sum(
        v[0] for k, v in acc.items() if not k[0]) / max(1, sum(v[1] for k, v in acc.items() if not k[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("fixture", help="a soak fixture (bench/soak_fixture.py)")
    ap.add_argument("--hold-out", default="llama3-8b", help="scenarios containing this are never fitted")
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE before fitting")
    ap.add_argument("--name", default=None, help="the fitted profile's name")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fit", default=None,
                    help="comma-separated names of the values to fit (default: the module's FIT list)")
    ap.add_argument("--ficco", default="target/release/ficco")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    text = open(args.profile).read()
    for kv in args.set:
        k, v = kv.split("=", 1)
        text = set_value(text, k, float(v))
    if args.name:
        text = re.sub(r'^name = ".*"$', f'name = "{args.name}"', text, count=1, flags=re.M)
    rows = json.load(open(args.fixture))["scenarios"]
    for s in rows:
        s["held"] = args.hold_out in s["scenario"]
    tmp = tempfile.mkdtemp()
    suite_path = os.path.join(tmp, "suite.toml")
    suite(rows, suite_path)

    def score(t):
        pred = predict(args.ficco, t, suite_path, tmp)
        return ({}, math.inf) if pred is None else errors(rows, pred)

    by, best = score(text)
    print(f"# start: fit MAPE {best:.4f}; " + ", ".join(
        f"{'held' if h else 'fit'} P={g} {e:.4f}" for (h, g), e in sorted(by.items())), flush=True)
    for r in range(args.rounds):
        moved = False
        for name in args.fit.split(",") if args.fit else FIT:
            try:
                _, v0 = locate(text, name)
            except SystemExit:
                continue
            for f in FACTORS:
                t = set_value(text, name, v0 * f)
                _, e = score(t)
                if e < best - 1e-5:
                    best, text, moved = e, t, True
                    _, v0 = locate(text, name)
            print(f"  round {r + 1} {name} = {locate(text, name)[1]:.6g}: fit MAPE {best:.4f}", flush=True)
        if not moved:
            break
    by, best = score(text)
    print(f"# end: fit MAPE {best:.4f}; " + ", ".join(
        f"{'held' if h else 'fit'} P={g} {e:.4f}" for (h, g), e in sorted(by.items())), flush=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
