"""A widely used CPU engine's figures (llama.cpp, 2 threads, the `small` preset's weights converted to GGUF), as
recorded per CPU type in docs/bench/targets.md and docs/bench/engine.md, for the comparisons in bench_table.py and
bench/engine/peer_table.py. Tokens/s per configuration of CONFIGS; None where not measured."""

# (label, engine_bench row measuring the same configuration, or None where only `genbridge run` does)
CONFIGS = [
    ("prefill, one 32-token prompt (tok/s)", "engine_prefill/prompt:32"),
    ("prefill, one 256-token prompt", "engine_prefill/prompt:256"),
    ("decode, batch 1 (64 new tokens after the 32-token prompt)", "engine_decode/batch:1/prompt:32/new:32/afd_stages:0"),
    ("prefill, 8 prompts", None),
    ("decode, batch 8", "engine_decode/batch:8/prompt:32/new:32/afd_stages:0"),
    ("decode, batch 32", "engine_decode/batch:32/prompt:32/new:32/afd_stages:0"),
    ("decode, batch 64", "engine_decode/batch:64/prompt:32/new:32/afd_stages:0"),
]

# Per CPU type, per weight format (bf16 "none"; q8_0 beside w8a8; MXFP4_MOE beside mxfp4).
PEERS = {
    "zen4": {  # 2-vCPU AMD EPYC Zen 4 (AVX-512, AVX512_BF16, VNNI, VBMI)
        "none": [392, 630, 133, 591, 198, 401, 474],
        "w8a8": [479, 505, 183, 455, 258, 342, 366],
        "mxfp4": [496, 491, 236, 539, 374, 383, 442],
    },
    "avx2": {  # 2-vCPU AMD EPYC, AVX2 only (bf16 only)
        "none": [283, 280, 101, None, 190, 242, None],
    },
}


def peer_for_targets(available):
    """The CPU type whose figures fit a run whose available CPU targets are `available` (a list of names)."""
    return "zen4" if "avx512" in available else "avx2"
