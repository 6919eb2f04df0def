#!/usr/bin/env python3
"""Rewrites an anchor sweep (`ficco evaluate --save` JSON: every schedule
measured) in the shape of `ficco tune --json`'s output, so that
`score_tune.py` scores it: per scenario every measured time, and the fastest
as the "tuned" pick (the ceiling of `ficco tune`).

    python3 bench/sweep_to_tune.py SWEEP.json OUT.json
    python3 score_tune.py FICCO_BINARY torch.jsonl OUT.json
"""

import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        report = json.load(f)
    entries = []
    for s in report["scenarios"]:
        measured = [[r["name"], r["time_ms"]] for r in s["schedules"]
                    if r.get("time_ms") is not None and not r.get("skipped")]
        if not measured:
            continue
        best = min(measured, key=lambda x: x[1])
        key = {k: s[k] for k in ("op", "m", "k", "n", "gpus")}
        entries.append(dict(key=key, measured=measured, schedule=best[0], time_ms=best[1]))
    with open(sys.argv[2], "w") as f:
        json.dump(dict(entries=entries), f)


if __name__ == "__main__":
    main()
