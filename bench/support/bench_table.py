#!/usr/bin/env python3
"""Markdown tables from Google Benchmark JSON files written by the genbridge benchmarks
(--benchmark_out=FILE --benchmark_out_format=json, optionally --benchmark_repetitions=N).

    bench_table.py FILE.json [FILE.json ...]

One table per file, headed by the run's context (CPU model, CPU target, threads, load average at start,
date). Each row is the repetition with the best roof_frac (the one least disturbed by neighbours on a
shared machine); `reps` gives the range of roof_frac over the repetitions. Aggregate rows are ignored.
"""
import json
import re
import sys

from peer_figures import CONFIGS, PEERS, peer_for_targets

COLUMNS = [  # (counter, heading, format)
    ("tok/s", "tok/s", "{:.1f}"),
    ("roof_tok/s", "roof tok/s", "{:.0f}"),
    ("x_batch1", "x batch 1", "{:.2f}"),
    ("GB/s", "GB/s", "{:.2f}"),
    ("copy_GB/s", "copy GB/s", "{:.1f}"),
    ("read_GB/s", "read GB/s", "{:.1f}"),
    ("mem_frac", "mem_frac", "{:.2f}"),
    ("GFLOP/s", "GFLOP/s", "{:.1f}"),
    ("fma_GFLOP/s", "FMA GFLOP/s", "{:.0f}"),
    ("fma_frac", "fma_frac", "{:.2f}"),
    ("bf16dot_GFLOP/s", "bf16-dot GFLOP/s", "{:.0f}"),
    ("dot_frac", "dot_frac", "{:.2f}"),
    ("roof_frac", "roof_frac", "{:.2f}"),
    ("experts", "experts", "{:.1f}"),
    ("load", "load", "{:.1f}"),
]


def row_name(b):
    name = b.get("run_name", b["name"])
    return re.sub(r"/(manual_time|iterations:\d+|real_time)", "", name)


def table(path):
    data = json.load(open(path))
    ctx = data["context"]
    rows = {}
    order = []
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        key = row_name(b)
        if key not in rows:
            rows[key] = []
            order.append(key)
        rows[key].append(b)
    print(f"`{path}`: {ctx.get('cpu_model', '?')}, CPU target **{ctx.get('cpu_target', '?')}** "
          f"(available: {ctx.get('cpu_targets_available', '?')}), {ctx.get('threads', '?')} threads, "
          f"LLC {int(ctx.get('llc_bytes', 0)) >> 20} MiB, load average at start {float(ctx.get('load_avg_at_start', -1)):.2f}, "
          f"{ctx.get('date', '')}\n")
    present = [c for c in COLUMNS if any(c[0] in b for rs in rows.values() for b in rs)]
    head = ["benchmark", "ms"] + [h for _, h, _ in present] + ["reps (roof_frac)", "label"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in order:
        reps = rows[key]
        best = max(reps, key=lambda b: b.get("roof_frac", 0))
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[best.get("time_unit", "ns")]
        fr = [b.get("roof_frac", 0) for b in reps]
        cells = [key, f"{best['real_time'] * unit:.3g}"]
        cells += [f.format(best[c]) if c in best else "" for c, _, f in present]
        cells += [f"{min(fr):.2f}–{max(fr):.2f} ({len(fr)})" if len(fr) > 1 else "1", best.get("label", "")]
        print("| " + " | ".join(cells) + " |")
    print()
    best = {k: max(rows[k], key=lambda b: b.get("roof_frac", 0)) for k in order}
    if any(k.startswith("engine_") for k in order):
        peer = peer_for_targets(ctx.get("cpu_targets_available", "").split())
        print(f"Beside a widely used CPU engine's figures for a 2-vCPU {peer} EPYC (bench/support/peer_figures.py; "
              f"same weights, bf16) next to this run (CPU target {ctx.get('cpu_target', '?')}):\n")
        print("| configuration | reference tok/s | genbridge tok/s | genbridge / reference |")
        print("|---|---:|---:|---:|")
        for (label, key), ref in zip(CONFIGS, PEERS[peer]["none"]):
            if key and ref and key in best and "tok/s" in best[key]:
                g = best[key]["tok/s"]
                print(f"| {label} | {ref} | {g:.1f} | {g / ref:.2f} |")
        print()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        table(p)
