#pragma once
// Internal: the shared KV-cache writer behind kv_cache/*_kv_write. Generic: it knows formats and
// slot-mapping shapes, never targets.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/attention/paged_decode.h"

namespace genbridge::ops::detail {

enum class SlotMapping {
  kFlat,          // int32 [num_tokens]: block * block_size + offset
  kPairs,         // int32 [num_tokens, 2]: [block, offset]
  kFlatOrPairs,   // either, told apart by rank
};

struct KvWriteCall {
  const char* op = "";
  SlotMapping slots = SlotMapping::kFlat;
  TensorView key, value, slot_mapping;
  PagedKvCache cache;
};

// Validates every argument and slot (InvalidArgument naming op, value and rule) and, only when all are
// valid, writes the rows. Parallel over kv heads, tokens in order inside a head: deterministic.
Status run_kv_write(const KvWriteCall& call);

}  // namespace genbridge::ops::detail
