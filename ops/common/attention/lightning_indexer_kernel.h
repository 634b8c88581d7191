#pragma once
// Internal: the shared kernel behind attention/lightning_indexer. Generic: representations and block
// tables, never targets.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

struct LightningIndexerCall {
  const char* op = "";
  TensorView q, weights;
  IndexerKeyCache keys;
  TensorView block_tables, context_lens, query_start_loc;
  TopkIndexFormat index_format = TopkIndexFormat::kSequencePositions;
  TensorView topk_indices, topk_scores;
};

// Validates every argument and, only when all are valid, writes the selection (the contract of
// attention/lightning_indexer). Scores are computed per (query, block of 16 positions), each the same way
// on any thread; the top-k is a total order (score, then position), so results never depend on threads.
Status run_lightning_indexer(const LightningIndexerCall& call);

}  // namespace genbridge::ops::detail
