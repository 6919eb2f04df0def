#!/usr/bin/env python3
"""The simulator's predictions beside a stored soak's measurements (the
fixture `bench/soak_fixture.py` writes): geomean predicted / measured and
MAPE, for `tile` schedules, the other overlapped ones and `seq`, and each
`tile-copy-ring|all` row at P = 4.

    python3 bench/sim_vs_soak.py [--ficco target/release/ficco] [--hw h100-nvlink] \\
        crates/ficco-core/tests/data/soak-h100x4-b405ac2.json
"""

import argparse
import json
import math
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ficco", default="target/release/ficco")
    ap.add_argument("--hw", default="h100-nvlink")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("fixture")
    args = ap.parse_args()
    rows = []
    for s in json.load(open(args.fixture))["scenarios"]:
        if s["gpus"] != args.gpus:
            continue
        out = subprocess.run(
            [args.ficco, "explore", "--op", s["op"], "--m", str(s["m"]), "--k", str(s["k"]),
             "--n", str(s["n"]), "--gpus", str(s["gpus"]), "--backend", "sim", "--hw", args.hw,
             "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        report = json.loads(out)
        sc = report["scenarios"][0] if "scenarios" in report else report
        pred = {x["name"]: x.get("predicted_ms") for x in sc["schedules"]}
        for name, t in s["times_ms"].items():
            if pred.get(name):
                rows.append((s["scenario"], name, t, pred[name]))

    def stats(keep):
        r = [p / t for _, n, t, p in rows if keep(n)]
        g = math.exp(sum(map(math.log, r)) / len(r))
        return len(r), g, sum(abs(v - 1) for v in r) / len(r)

    print(f"# {args.fixture}, P = {args.gpus}, profile {args.hw}")
    print(f"# {'schedules':10} {'rows':>5} {'pred/meas':>10} {'MAPE':>6}")
    for label, keep in [("tile", lambda n: n.startswith("tile")),
                        ("other", lambda n: not n.startswith("tile") and n != "seq"),
                        ("seq", lambda n: n == "seq")]:
        n, g, mape = stats(keep)
        print(f"  {label:10} {n:5d} {g:10.3f} {mape:6.1%}")
    for sc, n, t, p in rows:
        if n in ("tile-copy-ring", "tile-copy-all"):
            print(f"  {sc:34} {n:16} measured {t:7.3f} predicted {p:7.3f} ({p / t:.2f})")


if __name__ == "__main__":
    main()
