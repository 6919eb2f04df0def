#!/usr/bin/env python3
"""Residuals of the simulator against the 4x H200 sweeps.

Input: the CSV that `FICCO_SIM_DUMP=rows.csv cargo test -p ficco-core --release
--test sim_p4 -- --ignored dump` writes (one row per valid measured schedule time,
with the simulator's prediction). Prints, per sweep, the MAPE and the geomean
predicted/measured by schedule family, by op x family, by any other grouping
given with --by (granularity, engine, order, streams, acc, op, gpus, chunks), and
the worst rows.

    python3 bench/sim_residuals.py rows.csv [--sweep llama3-p4] [--by op,engine] [--worst 15]
"""
import argparse
import csv
import math
from collections import defaultdict


def parts(schedule):
    """Granularity, engine, order, streams, acc of a schedule name."""
    if schedule == "seq":
        return dict(gran="seq", engine="-", order="-", streams="1s", acc="-")
    t = schedule.split("-")
    return dict(
        gran=t[0],
        engine=t[1],
        order=t[2] if len(t) > 2 else "-",
        streams="2s" if "2s" in t else "1s",
        acc="acc" if "acc" in t else "-",
    )


def chunks(row):
    """Steps of the communication pipeline: P for shard, P x f for finef, 1 for bulk/seq."""
    g = row["gran"]
    p = int(row["gpus"])
    if g == "shard" or g == "tile":
        return p
    if g.startswith("fine"):
        return p * int(g[4:])
    return 1


def stats(rows):
    r = [x["ratio"] for x in rows]
    mape = sum(abs(v - 1) for v in r) / len(r)
    geo = math.exp(sum(math.log(v) for v in r) / len(r))
    return len(r), mape, geo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--sweep", default=None)
    ap.add_argument("--by", default="op,fam")
    ap.add_argument("--worst", type=int, default=10)
    a = ap.parse_args()
    rows = []
    with open(a.csv) as f:
        for x in csv.DictReader(f):
            x.update(parts(x["schedule"]))
            x["fam"] = "-".join(x["schedule"].split("-")[:2])
            x["measured_ms"] = float(x["measured_ms"])
            x["predicted_ms"] = float(x["predicted_ms"])
            x["ratio"] = x["predicted_ms"] / x["measured_ms"]
            x["chunks"] = chunks(x)
            rows.append(x)
    sweeps = sorted({x["sweep"] for x in rows}) if a.sweep is None else a.sweep.split(",")
    for s in sweeps:
        rs = [x for x in rows if x["sweep"] == s]
        n, mape, geo = stats(rs)
        print(f"== {s}: {n} rows, MAPE {100*mape:.1f}%, geomean {geo:.3f}")
        for key in a.by.split(","):
            keys = key.split("+")
            groups = defaultdict(list)
            for x in rs:
                groups[tuple(str(x[k]) for k in keys)].append(x)
            print(f"  by {key}:")
            for g in sorted(groups):
                n, mape, geo = stats(groups[g])
                print(f"    {'/'.join(g):<28} {n:>5}  MAPE {100*mape:5.1f}%  pred/meas {geo:.3f}")
        rs.sort(key=lambda x: -abs(x["ratio"] - 1))
        for x in rs[: a.worst]:
            print(f"  worst {x['scenario']:<40} {x['schedule']:<24} meas {x['measured_ms']:.4f} pred {x['predicted_ms']:.4f} ({x['ratio']:.2f}x)")


if __name__ == "__main__":
    main()
