#pragma once
// Internal: the shared paged-attention kernel behind attention/paged_decode. Generic: formats, head
// dimensions and block tables, never targets.

#include <cstdint>
#include <string>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/attention/paged_decode.h"

namespace genbridge::ops::detail {

// "64,80,96,112,128,192,256": the head dimensions of the switch below (= kPagedDecodeHeadDims).
std::string supported_head_dims_text();

// The one place where head_dim becomes a compile-time constant: calls fn.template operator()<D>() for D in
// kPagedDecodeHeadDims; any other value is Unimplemented "<op>: head_dim=32 not in {64,80,96,112,128,192,256}".
// (tests/ops/attention/paged_decode_test.cpp checks that the cases and the list agree.)
template <typename Fn>
Status with_head_dim(const char* op, int64_t head_dim, Fn&& fn) {
  switch (head_dim) {
    case 64: return fn.template operator()<64>();
    case 80: return fn.template operator()<80>();
    case 96: return fn.template operator()<96>();
    case 112: return fn.template operator()<112>();
    case 128: return fn.template operator()<128>();
    case 192: return fn.template operator()<192>();
    case 256: return fn.template operator()<256>();
    default:
      return unimplemented(std::string(op) + ": head_dim=" + std::to_string(head_dim) + " not in {" +
                           supported_head_dims_text() + "}");
  }
}

struct PagedDecodeCall {
  const char* op = "";
  TensorView query;
  PagedKvCache cache;
  TensorView block_tables, context_lens, query_start_loc;
  float softmax_scale = 1.f;
  TensorView out;
};

// Validates every argument (InvalidArgument naming op, value and rule; Unimplemented for an
// unsupported head_dim) and, only when all are valid, computes `out` (the contract of
// attention/paged_decode). Work items are (sequence, kv head, up to 16 query rows); each is computed
// the same way on any thread, so results never depend on the thread count or the batch.
Status run_paged_decode(const PagedDecodeCall& call);

}  // namespace genbridge::ops::detail
