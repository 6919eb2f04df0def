#!/usr/bin/env python3
"""Compacts `ficco soak --json` output into the fixture the selector tests
read (`crates/ficco-core/tests/data/`): per scenario, its shape and the
fastest time each schedule ran in (the soak times every schedule a few
iterations, with and without graphs; the faster of the two is the least
disturbed).

    python3 bench/soak_fixture.py --ficco target/release/ficco OUT.json SOAK.jsonl [SOAK.jsonl ...]

Shapes come from `ficco select --model M --tokens T --gpus P --json`, so
the scenario names must be the model presets' (llama3-8b.qkv.t2048.p4).
"""

import argparse
import json
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ficco", default="target/release/ficco")
    ap.add_argument("out")
    ap.add_argument("soaks", nargs="+")
    args = ap.parse_args()
    times = {}
    for path in args.soaks:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["result"] != "ok":
                    continue
                t = times.setdefault(r["scenario"], {})
                s = r["schedule"]
                t[s] = min(t.get(s, float("inf")), r["time_ms"])
    shapes = {}
    for key in {tuple(n.split(".")[0:1] + [n.split(".")[2][1:], n.split(".")[3][1:]]) for n in times}:
        model, tokens, gpus = key
        out = subprocess.run(
            [args.ficco, "select", "--model", model, "--tokens", tokens, "--gpus", gpus,
             "--no-cache", "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        for s in json.loads(out)["selections"]:
            shapes[s["scenario"]] = {k: s[k] for k in ("op", "m", "k", "n", "gpus")}
    fixture = {
        "source": args.soaks,
        "scenarios": [
            {"scenario": name, **shapes[name], "times_ms": dict(sorted(t.items()))}
            for name, t in sorted(times.items())
        ],
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=0, sort_keys=False)
        f.write("\n")


if __name__ == "__main__":
    main()
