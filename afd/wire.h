#pragma once
// Internal: the bytes on the wire. Every transfer starts with one 64-byte header; the header carries
// enough to check the message against what the receiver expects (kind, layer, stage, step, sender)
// and the sender's clock for latency accounting (steady clock; comparable across the ranks of one host).
// A transfer's rows travel as a second message right behind its header message (same channel and tag,
// so MPI's non-overtaking order pairs them): that keeps the rows one contiguous message whenever the
// rows themselves are contiguous, which MPI moves with a single copy (a multi-segment datatype would
// disable that and cost 2-3x at 64 KiB..1 MiB on shared memory).
//
//   work    (attention -> FFN, kDispatch, tag = stage): [header | topk_ids i32 [m, k] | topk_weights f32 [m, k]]
//           then [hidden bf16 [m, H]] (possibly empty), or with a quantized dispatch (AfdConfig::dispatch_row_bytes)
//           [rows of codes and scales, uint8 [m, dispatch_row_bytes]] (runtime/device/moe_dispatch.h)
//   result  (FFN -> attention, kCombine, tag = stage):  [header] then [expert outputs bf16 [rows, H]]
//   done    (attention -> FFN, kDispatch, tag 0; async): [header] (no rows message)
//   step    (attention -> FFN, kControl, kTagStep; sync): [header | stage token counts i32 [S]]
//   stop    (attention -> FFN, kControl, kTagStep; sync): [header]

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace genbridge::afd::wire {

inline constexpr uint32_t kMagic = 0x46414247u;  // "GBAF"
inline constexpr uint16_t kVersion = 1;

enum class Kind : uint8_t { kWork = 1, kResult = 2, kDone = 3, kStep = 4, kStop = 5 };
inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kWork:
      return "work";
    case Kind::kResult:
      return "result";
    case Kind::kDone:
      return "done";
    case Kind::kStep:
      return "step";
    case Kind::kStop:
      return "stop";
  }
  return "unknown";
}

inline constexpr uint8_t kFlagWarmup = 1;

// Control-channel tags.
inline constexpr int kTagStep = 1;
inline constexpr int kTagGatherSize = 2;
inline constexpr int kTagGatherData = 3;
inline constexpr int kTagScatterSize = 4;
inline constexpr int kTagScatterData = 5;
inline constexpr int kTagLoadRelease = 6;  // world rank 0 -> every rank: every rank has loaded its weights
// StepAgreement instance i uses tags kTagStepAgreement + 2i (to the coordinator) and + 2i + 1 (its answer).
inline constexpr int kTagStepAgreement = 16;
// A serving job's relay (afd/serve_relay.h): attention rank 0 -> attention rank a, and back.
inline constexpr int kTagRelayDown = 32;
inline constexpr int kTagRelayUp = 33;

struct Header {
  uint32_t magic;
  uint16_t version;
  Kind kind;
  uint8_t flags;
  int32_t layer;
  int32_t stage;
  int32_t source;      // sender's index within its role
  int32_t num_tokens;  // work: tokens; step: number of stages
  int64_t step;
  int32_t num_rows;  // result: expert-output rows
  int32_t top_k;
  int32_t hidden;
  int32_t reserved;
  int64_t send_ns;  // sender's steady clock when the send was posted
  int64_t aux_ns;   // unused, zero
};
static_assert(sizeof(Header) == 64, "the wire header is 64 bytes");

inline constexpr size_t kHeaderBytes = sizeof(Header);

// Bytes of a work transfer's first message (header and routing).
inline size_t work_meta_bytes(int64_t tokens, int top_k) {
  return kHeaderBytes + static_cast<size_t>(tokens) * static_cast<size_t>(top_k) * 8;
}
// Bytes of the rows message of `rows` rows of `hidden` bf16 elements.
inline size_t rows_bytes(int64_t rows, int hidden) {
  return static_cast<size_t>(rows) * static_cast<size_t>(hidden) * 2;
}
// Bytes of a work transfer's rows message of `tokens` rows of `row_bytes` bytes each
// (AfdConfig::dispatch_bytes_per_token()).
inline size_t dispatch_rows_bytes(int64_t tokens, int64_t row_bytes) {
  return static_cast<size_t>(tokens) * static_cast<size_t>(row_bytes);
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace genbridge::afd::wire
