#pragma once
// Internal: the shared KV-cache writer behind kv_cache/*_kv_write. Generic: it knows formats and
// slot-mapping shapes, never targets.

#include <cstdint>
#include <optional>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

struct KvWriteCall {
  const char* op = "";
  // The one slot mapping the op accepts (ops::SlotMapping, kv_cache/kv_format.h); nullopt: either, told
  // apart by rank.
  std::optional<SlotMapping> slots = SlotMapping::kFlat;
  TensorView key, value, slot_mapping;
  PagedKvCache cache;
  // Encodes one fp32 row of head_dim values into a cache row of a representation the shared writer does
  // not implement: the fp8 cache (kFp8Fp32PackedScale), whose encoder is private to the generation that
  // has it (ops/target_providers/<Target>/kv_cache/). Required for that format, unused otherwise.
  void (*encode_row)(const float* x, int64_t head_dim, uint8_t* row) = nullptr;
};

// Validates every argument and slot (InvalidArgument naming op, value and rule) and, only when all are
// valid, writes the rows. Parallel over kv heads, tokens in order inside a head: deterministic.
Status run_kv_write(const KvWriteCall& call);

}  // namespace genbridge::ops::detail
