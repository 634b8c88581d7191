#!/usr/bin/env python3
"""The engine beside a widely used CPU engine's figures (docs/bench/targets.md, "Beside llama.cpp on this CPU type"), measured with
`genbridge run` on the `small` preset: each configuration of that comparison, in bf16 and with w8a8 and mxfp4
weights, interleaved over ROUNDS rounds (a shared machine's slow moments then fall on every cell alike); each cell
is the median of the rounds, with the range.

    python3 bench/engine/peer_table.py [--genbridge build/ascend950/tools/genbridge] [--rounds 3]
                                       [--quants none,w8a8,mxfp4] [--peer zen4|avx2]

GENBRIDGE_CACHE_DIR and GENBRIDGE_NUM_THREADS pass through (the synthetic model is built once and cached).
Prints one progress line per run, then the markdown table with the CPU target, load average and commit.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from peer_figures import CONFIGS as PEER_CONFIGS, PEERS  # noqa: E402  (the peer's figures: one place)

# `genbridge run` arguments and the metric it prints, per configuration of peer_figures.CONFIGS (same order).
RUNS = [
    (["--num-prompts", "1", "--prompt-len", "32", "--max-new-tokens", "1"], "prefill"),
    (["--num-prompts", "1", "--prompt-len", "256", "--max-new-tokens", "1"], "prefill"),
    (["--num-prompts", "1", "--prompt-len", "32", "--max-new-tokens", "64"], "decode"),
    (["--num-prompts", "8", "--prompt-len", "32", "--max-new-tokens", "32"], "prefill"),
    (["--num-prompts", "8", "--prompt-len", "32", "--max-new-tokens", "32"], "decode"),
    (["--num-prompts", "32", "--prompt-len", "32", "--max-new-tokens", "32", "--max-batch", "32"], "decode"),
    (["--num-prompts", "64", "--prompt-len", "32", "--max-new-tokens", "32", "--max-batch", "64"], "decode"),
]
CONFIGS = [(label, args, metric) for (label, _), (args, metric) in zip(PEER_CONFIGS, RUNS)]


def run_once(genbridge, quant, args):
    cmd = [genbridge, "run", "--weight-quant", quant] + args
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    text = out.stdout + out.stderr
    vals = {m: float(v) for m, v in re.findall(r"^(prefill|decode) tokens/s\s+([0-9.]+)", text, re.M)}
    target = re.search(r"cpu target: (\S+)", text)
    return vals, target.group(1) if target else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--genbridge", default="build/ascend950/tools/genbridge")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quants", default="none,w8a8,mxfp4")
    ap.add_argument("--peer", default="zen4", choices=sorted(PEERS))
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("--rounds must be at least 1")
    quants = a.quants.split(",")
    for q in quants:
        if q not in ("none", "w8a8", "mxfp8", "mxfp4"):
            sys.exit(f"--quants: unknown weight format '{q}' (none, w8a8, mxfp8, mxfp4)")
    # Runs that print both metrics are shared between configurations.
    runs = {}
    cells = {}
    target = "?"
    loads = []
    t0 = time.time()
    for r in range(a.rounds):
        for q in quants:
            for i, (label, args, metric) in enumerate(CONFIGS):
                key = (q, tuple(args), r)
                if key not in runs:
                    loads.append(float(open("/proc/loadavg").read().split()[0]))
                    runs[key], target = run_once(a.genbridge, q, args)
                    print(f"[{time.time() - t0:6.1f} s] round {r + 1}/{a.rounds} {q:5s} {' '.join(args)}: "
                          + ", ".join(f"{m} {v:.1f} tok/s" for m, v in runs[key].items()), file=sys.stderr, flush=True)
                cells.setdefault((q, i), []).append(runs[key][metric])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    model = open("/proc/cpuinfo").read()
    cpu = re.search(r"model name\s*:\s*(.*)", model)
    print(f"\n`genbridge run`, small preset, commit {commit}, CPU {cpu.group(1) if cpu else '?'}, cpu target {target}, "
          f"{os.environ.get('GENBRIDGE_NUM_THREADS', 'default')} threads, load average {min(loads):.2f}-{max(loads):.2f}, "
          f"{a.rounds} rounds (median, range); peer figures: {a.peer}\n")
    peer = PEERS[a.peer]
    head = ["configuration"]
    for q in quants:
        head += [f"peer ({q})", f"genbridge ({q})", "ratio"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for i, (label, _, _) in enumerate(CONFIGS):
        row = [label]
        for q in quants:
            xs = cells[(q, i)]
            med = statistics.median(xs)
            p = (peer.get(q) or [None] * len(CONFIGS))[i]
            row += [str(p) if p else "", f"{med:.0f} ({min(xs):.0f}-{max(xs):.0f})", f"{med / p:.2f}" if p else ""]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
