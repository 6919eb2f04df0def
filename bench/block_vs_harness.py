"""How much of the harness's saving the Llama block keeps (issue 28's 90%
target), measured in one device call.

    torchrun --nproc-per-node P examples/llama_tp_block.py --mode all --json BLOCK.json
    python3 bench/block_vs_harness.py BLOCK.json --run OUTDIR   # the harness, same GPUs
    python3 bench/block_vs_harness.py BLOCK.json --report OUTDIR

``--run`` times the block's call sites in ficco's harness: one ``ficco
explore --backend gpu --schedule S --json`` per distinct schedule that ran
(its ``seq`` row is the sequential reference of the same problem).
``--report`` prints, per call site, the harness's ``seq - schedule``, their
sum per block, and for each mode the block's saving (PyTorch sequential
minus ficco) and the share of the harness's saving it keeps. A site that ran
PyTorch's sequential reference (``auto`` fell back) saves 0 in both.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def sites(block):
    return [s for s in block["sites"] if s["ran"]]


def suite(block, schedule):
    """A suite TOML of the distinct problems that ran `schedule`."""
    seen, out = set(), []
    for s in sites(block):
        key = (s["op"], s["m"], s["k"], s["n"])
        if s["ran"] != schedule or key in seen:
            continue
        seen.add(key)
        out.append(
            f'[[scenario]]\nname = "{s["site"]}"\nop = "{s["op"]}"\nm = {s["m"]}\n'
            f'k = {s["k"]}\nn = {s["n"]}\ngpus = {block["P"]}\n'
        )
    return "\n".join(out)


def run(block, out: Path, ficco: str, backend: str):
    out.mkdir(parents=True, exist_ok=True)
    for schedule in sorted({s["ran"] for s in sites(block)} - {"seq"}):
        toml = out / f"suite-{schedule}.toml"
        toml.write_text(suite(block, schedule))
        with open(out / f"harness-{schedule}.json", "w") as f:
            subprocess.run(
                [ficco, "explore", "--suite", str(toml), "--backend", backend, "--schedule", schedule, "--json"],
                stdout=f, check=True,
            )


def harness_times(out: Path):
    """(op, m, k, n, schedule) -> (seq ms, schedule ms) from the runs."""
    got = {}
    for f in sorted(out.glob("harness-*.json")):
        d = json.loads(f.read_text())
        for sc in d.get("scenarios", [d]):
            rows = {r["name"]: r["time_ms"] for r in sc["schedules"] if r.get("time_ms") is not None}
            for name, t in rows.items():
                if name != "seq" and "seq" in rows:
                    got[(sc["op"], sc["m"], sc["k"], sc["n"], name)] = (rows["seq"], t)
    return got


def report(block, out: Path):
    got = harness_times(out)
    harness = 0.0
    print(f"# Llama block, T={block['tokens']}, P={block['P']}, {block['device']}")
    print(f"# {'site':8} {'op':7} {'m':>6} {'k':>6} {'n':>6} {'ran':22} {'seq':>8} {'sched':>8} {'saving':>8}  (ms, harness)")
    for s in sites(block):
        if s["ran"] == "seq":
            saving, pair = 0.0, ("-", "-")
        else:
            pair_ = got.get((s["op"], s["m"], s["k"], s["n"], s["ran"]))
            if pair_ is None:
                print(f"  {s['site']:8} no harness time for {s['ran']}", file=sys.stderr)
                continue
            saving, pair = pair_[0] - pair_[1], (f"{pair_[0]:.3f}", f"{pair_[1]:.3f}")
        harness += saving
        print(f"  {s['site']:8} {s['op']:7} {s['m']:6} {s['k']:6} {s['n']:6} {s['ran']:22} "
              f"{pair[0]:>8} {pair[1]:>8} {saving:8.3f}")
    print(f"# harness saving per block: {harness:.3f} ms")
    for mode, t in block["times"].items():
        if "pytorch" in t and "ficco" in t:
            saved = t["pytorch"] - t["ficco"]
            share = f"{saved / harness:.0%}" if harness > 0 else "-"
            bound = ""
            if "no-comm" in t:
                # What any overlap could save: the collectives' whole cost.
                most = t["pytorch"] - t["no-comm"]
                bound = (f"; communication free (no-comm) {t['no-comm']:.3f} ms, "
                         f"{t['pytorch'] / t['no-comm']:.2f}x PyTorch: the block saves "
                         f"{saved / most:.0%} of the {most:.3f} ms it costs" if most > 0 else "")
            print(f"  {mode:8} block saving {saved:.3f} ms = {share} of the harness's{bound}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("block", type=Path, help="the example's --json file")
    p.add_argument("--run", type=Path, metavar="DIR", help="time the sites in the harness into DIR")
    p.add_argument("--report", type=Path, metavar="DIR", help="compare with the harness times in DIR")
    p.add_argument("--ficco", default=os.environ.get("FICCO", ".bin/ficco"))
    p.add_argument("--backend", default="gpu", help="gpu, or sim for a dry run of the script")
    a = p.parse_args()
    block = json.loads(a.block.read_text())
    if a.run:
        run(block, a.run, a.ficco, a.backend)
    if a.report:
        report(block, a.report)


if __name__ == "__main__":
    main()
