#!/usr/bin/env python3
"""Compacts anchor sweeps (`bench/anchor.sh`: ficco's `evaluate --save`
JSON and PyTorch's `torch.jsonl` from the same device call) into the fixture
the selector tests read (`crates/ficco-core/tests/data/`): per scenario, its
shape, every schedule's measured time, and PyTorch's sequential and ideal
times (what E is computed against).

    python3 bench/sweep_fixture.py OUT.json LABEL=FICCO.json:TORCH.jsonl [...]

LABEL names the sweep (its suite and GPU count) in the fixture.
"""

import json
import sys


def sweep(label, ficco_path, torch_path):
    torch = {}
    with open(torch_path) as f:
        for line in f:
            r = json.loads(line)
            torch[(r["op"], r["m"], r["k"], r["n"], r["gpus"])] = r
    rows = []
    with open(ficco_path) as f:
        report = json.load(f)
    for s in report["scenarios"]:
        t = torch[(s["op"], s["m"], s["k"], s["n"], s["gpus"])]
        times = {r["name"]: round(r["time_ms"], 5) for r in s["schedules"]
                 if r.get("time_ms") is not None and not r.get("skipped")}
        rows.append(dict(scenario=s["scenario"], op=s["op"], m=s["m"], k=s["k"], n=s["n"],
                         gpus=s["gpus"], torch_seq_ms=round(t["seq_ms"], 5),
                         torch_ideal_ms=round(t["ideal_ms"], 5), times_ms=times))
    return dict(label=label, hardware=report["scenarios"][0]["hardware"], scenarios=rows)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sweeps = []
    for arg in sys.argv[2:]:
        label, _, paths = arg.partition("=")
        ficco_path, _, torch_path = paths.partition(":")
        sweeps.append(sweep(label, ficco_path, torch_path))
    with open(sys.argv[1], "w") as f:
        json.dump(dict(sweeps=sweeps), f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
