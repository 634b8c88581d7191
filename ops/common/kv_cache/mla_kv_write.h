#pragma once
// Internal: the shared writer behind kv_cache/*_mla_kv_write and kv_cache/*_indexer_key_write (one row per
// token). Generic: it knows representations and slot-mapping forms, never targets.

#include <cstdint>
#include <optional>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

// Encodes one token's fp32 values (width elements, then rope_dim rope elements; rope may be null when
// rope_dim is 0) into a main-cache row of a packed representation the shared writer does not implement
// (the fp8 ones, whose encoders are private to the generation that has them).
using TokenRowEncoder = void (*)(const float* x, int64_t width, const float* rope, int64_t rope_dim, uint8_t* row);

struct MlaKvWriteCall {
  const char* op = "";
  std::optional<SlotMapping> slots;  // the one accepted form; nullopt: either, told apart by rank
  MlaKvFormat format = MlaKvFormat::kBf16;  // the op's representation; the cache must have it
  TensorView latent, rope, slot_mapping;
  MlaKvCache cache;
  TokenRowEncoder encode_row = nullptr;  // required for packed fp8 rows
};

struct IndexerKeyWriteCall {
  const char* op = "";
  std::optional<SlotMapping> slots;
  IndexerKeyFormat format = IndexerKeyFormat::kBf16;
  TensorView key, slot_mapping;
  IndexerKeyCache cache;
  TokenRowEncoder encode_row = nullptr;  // required for packed fp8 rows
};

// Validate every argument and slot (InvalidArgument naming op, value and rule) and, only when all are
// valid, write the rows, tokens in order (a repeated slot keeps the last).
Status run_mla_kv_write(const MlaKvWriteCall& call);
Status run_indexer_key_write(const IndexerKeyWriteCall& call);

}  // namespace genbridge::ops::detail
