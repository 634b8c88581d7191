#!/usr/bin/env python3
"""Turns a Google Benchmark JSON file from linear_bench or expert_ffn_bench (run with
--benchmark_repetitions=N --benchmark_out=FILE --benchmark_out_format=json) into the markdown table of
docs/bench/linear.md: medians over the repetitions, and the best repetition's ratio to the copy kernel."""
import json
import sys


def main(path):
    data = json.load(open(path))
    best = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "iteration":
            best[b["run_name"]] = max(best.get(b["run_name"], 0.0), b["ratio"])
    rows = []
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        args = dict(p.split(":") for p in b["run_name"].replace("/manual_time", "").split("/")[1:])
        t_us = b["real_time"] / 1e3 if b["time_unit"] == "ns" else b["real_time"]
        rows.append((args, t_us, b["GB/s"], b["copy_GB/s"], b["ratio"], best[b["run_name"]], b["GFLOP/s"] / 1e9,
                     b.get("experts")))
    keys = list(rows[0][0].keys())
    experts = rows[0][7] is not None
    head = ["M" if k == "M" else k for k in keys] + (["experts read"] if experts else []) + [
        "time (us)", "weight GB/s", "copy GB/s", "ratio (median)", "ratio (best rep)", "GFLOP/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for args, t, gbps, copy, ratio, best_ratio, gflops, n in rows:
        cells = [args[k] for k in keys] + ([str(int(n))] if experts else []) + [
            f"{t:.0f}", f"{gbps:.1f}", f"{copy:.1f}", f"{ratio:.2f}", f"{best_ratio:.2f}", f"{gflops:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
