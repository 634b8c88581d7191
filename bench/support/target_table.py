#!/usr/bin/env python3
"""Compares CPU targets row by row: Google Benchmark JSON files of the same benchmark run under different
GENBRIDGE_CPU_TARGET values (bench/record.sh writes them as BENCH.TARGET.json, or BENCH.TARGET.roundN.json
with ROUNDS > 1: several files of one benchmark and target are one run, each row at its best).

    target_table.py [--tolerance 0.05] FILE.json [FILE.json ...]

Per benchmark executable, one table: each row's time under every target (the best repetition of every
round: the shortest real time, as bench_table.py keeps the best roof_frac), and each target's speed relative to the
target the dispatcher picks on this CPU (the first of `cpu_targets_available`, the run without
GENBRIDGE_CPU_TARGET). A row where a lower target is faster than the dispatcher's by more than the
tolerance is marked **slower**; the summary line counts them, and the exit status is 1 when any row is
(so a script can refuse a tuning that makes the default lose to a forced lower target).
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

from bench_table import row_name  # the same row names as the per-run tables


def load(path):
    data = json.load(open(path))
    ctx = data["context"]
    rows = OrderedDict()
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        ms = b["real_time"] * unit
        key = row_name(b)
        rows[key] = min(rows.get(key, ms), ms)
    return ctx, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="a lower target this much faster than the dispatcher's marks a row (default 0.05)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    # executable -> target -> (rows at their best over the runs, the runs' contexts)
    runs = OrderedDict()
    for path in args.files:
        ctx, rows = load(path)
        exe = os.path.basename(ctx.get("executable", path))
        target = ctx.get("cpu_target", "?")
        by_target = runs.setdefault(exe, OrderedDict())
        if target in by_target:  # another round: each row at its best
            old = by_target[target][0]
            for key, ms in rows.items():
                old[key] = min(old.get(key, ms), ms)
            by_target[target][1].append(ctx)
        else:
            by_target[target] = (rows, [ctx])
    slower = total = 0
    for exe, by_target in runs.items():
        ctx0 = next(iter(by_target.values()))[1][0]
        available = ctx0.get("cpu_targets_available", "").split()
        default = available[0] if available else None
        targets = [t for t in available if t in by_target] + [t for t in by_target if t not in available]
        if default not in by_target:
            print(f"{exe}: no run under the dispatcher's target ({default}); compared with {targets[0]}\n")
            default = targets[0]
        loads = ", ".join(f"{t} " + " / ".join(f"{float(c.get('load_avg_at_start', -1)):.2f}" for c in by_target[t][1])
                          for t in targets)
        print(f"`{exe}`: {ctx0.get('cpu_model', '?')}, {ctx0.get('threads', '?')} threads, dispatcher's target "
              f"**{default}** (available: {' '.join(available)}); load average at the start of each run: {loads}\n")
        head = ["benchmark"] + [f"{t} ms" for t in targets] + [f"{default} / {t}" for t in targets if t != default]
        head.append("")
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * (len(head) - 2) + "---|")
        keys = list(by_target[default][0].keys())
        keys += [k for t in targets for k in by_target[t][0] if k not in keys]
        for key in keys:
            times = {t: by_target[t][0].get(key) for t in targets}
            base = times[default]
            cells = [key] + [f"{times[t]:.3g}" if times[t] is not None else "" for t in targets]
            mark = ""
            for t in targets:
                if t == default:
                    continue
                if base is None or times[t] is None:
                    cells.append("")
                    continue
                speed = times[t] / base  # > 1: the dispatcher's target is faster
                cells.append(f"{speed:.2f}")
                if speed < 1 - args.tolerance:
                    mark = "**slower**"
            if base is not None and any(times[t] is not None for t in targets if t != default):
                total += 1
                slower += mark != ""
            cells.append(mark)
            print("| " + " | ".join(cells) + " |")
        print()
    print(f"{slower} of {total} rows: the dispatcher's target slower than a lower target by more than "
          f"{args.tolerance:.0%}.")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
