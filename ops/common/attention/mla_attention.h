#pragma once
// Internal: the shared MLA kernel behind attention/mla_decode and attention/sparse_mla_decode. Generic:
// representations (kv_cache/kv_format.h) and block tables, never targets.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

struct MlaAttentionCall {
  const char* op = "";
  TensorView q_latent, q_rope;
  MlaKvCache cache;
  TensorView block_tables, context_lens, query_start_loc;
  bool sparse = false;      // attend to topk_indices' entries instead of every causal position
  TensorView topk_indices;  // sparse only
  TopkIndexFormat index_format = TopkIndexFormat::kSequencePositions;
  float softmax_scale = 1.f;
  TensorView out;
  // attention/sharedkv_sparse_attention: no block tables; every query token attends to its row of
  // topk_indices (flat slots of `cache`) and then its row of indices2 (flat slots of cache2) as one list
  // (sparse and kFlatKvSlots are implied); V is the whole row (latent and rope: out is [T, H, L + R]); an
  // optional fp32 sink per head adds exp(sink) to the softmax's denominator.
  bool shared_kv = false;
  MlaKvCache cache2;
  TensorView indices2;
  TensorView sinks;  // fp32 [num_heads], or empty
};

// Validates every argument (InvalidArgument naming op, value and rule) and, only when all are valid,
// computes `out`. Both ops attend to a list of cached rows in list order (dense: positions 0..p), in
// tiles of 16 list entries with an online softmax, so the same list gives the same bits. Work items are
// (query token, 8 heads); results never depend on threads, the batch or the CPU target.
Status run_mla_attention(const MlaAttentionCall& call);
// The shared-KV form (call.shared_kv): validates its own arguments the same way, then runs the same kernel.
Status run_sharedkv_attention(const MlaAttentionCall& call);

}  // namespace genbridge::ops::detail
