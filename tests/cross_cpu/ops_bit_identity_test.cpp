// Every stable op gives the same output bytes under every CPU target this machine can run (the
// reduction-order contracts do not depend on the vector width), on inputs with tails, strides and edge
// values. Ops this build does not have (Unimplemented) are reported as such. Each case prints its digest
// (see cases.h); tests/cross_cpu/CMakeLists.txt compares them with another build's (x86-64 vs aarch64).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "cross_cpu/cases.h"
#include "genbridge/ops/activation/sigmoid_mul.h"
#include "genbridge/ops/activation/silu_and_mul.h"
#include "genbridge/ops/attention/lightning_indexer.h"
#include "genbridge/ops/attention/mla_decode.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/attention/sparse_mla_decode.h"
#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"
#include "genbridge/ops/attention/kv_compress.h"
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"
#include "genbridge/ops/linear_attention/causal_conv1d.h"
#include "genbridge/ops/linear_attention/gated_delta_rule.h"
#include "genbridge/ops/linear_attention/gdn_gating.h"
#include "genbridge/ops/norm/gated_rms_norm.h"
#include "genbridge/ops/norm/layer_norm.h"
#include "genbridge/ops/attention/rope.h"
#include "genbridge/ops/kv_cache/bf16_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/moe/expert_ffn.h"
#include "genbridge/ops/moe/grouped_topk_router.h"
#include "genbridge/ops/moe/moe_combine.h"
#include "genbridge/ops/moe/sqrt_softplus_router.h"
#include "genbridge/ops/moe/topk_router.h"
#include "genbridge/ops/norm/add_gemma_rms_norm.h"
#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "genbridge/ops/quant/mx_dequant.h"
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"
#include "genbridge/ops/residual/hyper_connection.h"

namespace genbridge::cross_cpu {
namespace {

std::string dt(DType t) { return short_name(t); }

// K = 131 (8 full 16-lane groups and a tail of 3), N = 37; M = 1 (the GEMV path) and M = 9 (a batch: the
// GEMM path once it exists); x strided in one case.
TEST(CrossCpu, linear) {
  for (DType xd : kFloatTypes) {
    for (DType wd : kFloatTypes) {
      for (int64_t m : {1, 9}) {
        const DType yd = xd;
        const bool strided = m == 9 && wd == DType::kBF16;
        const std::string name = "linear.x_" + dt(xd) + ".w_" + dt(wd) + ".m" + std::to_string(m) + (strided ? ".strided" : "");
        check_case(name, [&] {
          const int64_t k = 131, n = 37;
          Buf x(xd, {m, k}, strided ? k + 5 : 0), w(wd, {n, k}), bias(DType::kBF16, {n}), y(yd, {m, n});
          fill(x, 1);
          fill(w, 2, -0.5f, 0.5f, Edges::kNone);
          fill(bias, 3);
          TensorView bv = bias.view();
          CaseResult r;
          if (op_ok(ops::linear(x.view(), w.view(), y.view(), m == 9 ? &bv : nullptr), r)) r.outputs.push_back(output_of(y));
          return r;
        });
      }
    }
  }
}

// Stacked weights, H = 45, I = 38, 5 experts of which this call owns [1, 4); ids include -1 and experts
// outside the range, which must stay unwritten.
TEST(CrossCpu, expert_ffn) {
  for (DType wd : kFloatTypes) {
    for (DType xd : {DType::kBF16, DType::kF32}) {
      for (int64_t t : {1, 9}) {
        const std::string name = "expert_ffn.x_" + dt(xd) + ".w_" + dt(wd) + ".t" + std::to_string(t);
        check_case(name, [&] {
          const int64_t h = 45, i = 38, e = 5, k = 2;
          Buf x(xd, {t, h}), ids(DType::kI32, {t, k}), wg(wd, {e, i, h}), wu(wd, {e, i, h}), wdn(wd, {e, h, i}),
              out(xd, {t, k, h});
          fill(x, 11);
          fill(wg, 12, -0.3f, 0.3f, Edges::kNone);
          fill(wu, 13, -0.3f, 0.3f, Edges::kNone);
          fill(wdn, 14, -0.3f, 0.3f, Edges::kNone);
          for (int64_t j = 0; j < t * k; ++j) ids.as<int32_t>()[j] = static_cast<int32_t>(j % 7) - 1;  // -1 .. 5
          for (int64_t j = 0; j < t * k; ++j) {
            if (ids.as<int32_t>()[j] == 5) ids.as<int32_t>()[j] = 4;
          }
          CaseResult r;
          if (op_ok(ops::expert_ffn(x.view(), ids.view(), wg.view(), wu.view(), wdn.view(), 1, 4, out.view()), r)) {
            r.outputs.push_back(output_of(out));
          }
          return r;
        });
      }
    }
  }
}

// The same with DeepSeek-V4's swiglu_limit (0.5: gates above it and ups on both sides are clamped).
TEST(CrossCpu, expert_ffn_swiglu_limit) {
  for (int64_t t : {1, 9}) {
    const std::string name = "expert_ffn.swiglu_limit.t" + std::to_string(t);
    check_case(name, [&] {
      const int64_t h = 45, i = 38, e = 5, k = 2;
      Buf x(DType::kBF16, {t, h}), ids(DType::kI32, {t, k}), wg(DType::kBF16, {e, i, h}), wu(DType::kBF16, {e, i, h}),
          wdn(DType::kBF16, {e, h, i}), out(DType::kBF16, {t, k, h});
      fill(x, 15);
      fill(wg, 16, -0.3f, 0.3f, Edges::kNone);
      fill(wu, 17, -0.3f, 0.3f, Edges::kNone);
      fill(wdn, 18, -0.3f, 0.3f, Edges::kNone);
      for (int64_t j = 0; j < t * k; ++j) ids.as<int32_t>()[j] = static_cast<int32_t>(j % e);
      CaseResult r;
      if (op_ok(ops::expert_ffn(x.view(), ids.view(), wg.view(), wu.view(), wdn.view(), 0, e, out.view(), 0.5f), r)) {
        r.outputs.push_back(output_of(out));
      }
      return r;
    });
  }
}

TEST(CrossCpu, moe_combine) {
  for (DType d : kFloatTypes) {
    for (int shared : {0, 1, 2}) {  // none, shared_out alone, shared_out with its sigmoid gate
      const std::string name = "moe_combine." + dt(d) + ".shared" + std::to_string(shared);
      check_case(name, [&] {
        const int64_t t = 5, k = 3, h = 70;
        Buf eo(d, {t, k, h}), w(DType::kF32, {t, k}), out(d, {t, h}), so(d, {t, h}), sg(DType::kF32, {t, 1});
        fill(eo, 21);
        fill(w, 22, 0.f, 1.f, Edges::kNone);
        fill(so, 23);
        fill(sg, 24, -6.f, 6.f);
        TensorView sov = so.view(), sgv = sg.view();
        CaseResult r;
        if (op_ok(ops::moe_combine(eo.view(), w.view(), out.view(), shared ? &sov : nullptr, shared == 2 ? &sgv : nullptr),
                  r)) {
          r.outputs.push_back(output_of(out));
        }
        return r;
      });
    }
  }
}

// E = 19 experts, k = 4; row 2 holds NaN and infinities, row 4 ties (equal logits).
TEST(CrossCpu, topk_router) {
  for (DType d : kFloatTypes) {
    for (bool norm : {false, true}) {
      const std::string name = "topk_router." + dt(d) + (norm ? ".norm" : ".raw");
      check_case(name, [&] {
        const int64_t t = 7, e = 19, k = 4;
        Buf logits(d, {t, e}), ids(DType::kI32, {t, k}), w(DType::kF32, {t, k});
        fill(logits, 31, -4.f, 4.f, Edges::kNone);
        set_float(logits, 2 * e + 3, std::numeric_limits<float>::quiet_NaN());
        set_float(logits, 2 * e + 7, std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < e; ++j) set_float(logits, 4 * e + j, j % 3 == 0 ? 1.5f : 0.25f);
        CaseResult r;
        if (op_ok(ops::topk_router(logits.view(), norm, ids.view(), w.view()), r)) {
          r.outputs.push_back(output_of(ids));
          r.outputs.push_back(output_of(w));
        }
        return r;
      });
    }
  }
}

// DeepSeek routing: E = 24 experts in 4 groups, 2 kept, k = 4, with a bias; row 2 holds NaN and infinities,
// row 4 ties.
TEST(CrossCpu, grouped_topk_router) {
  for (DType d : kFloatTypes) {
    for (bool norm : {false, true}) {
      const std::string name = "grouped_topk_router." + dt(d) + (norm ? ".norm" : ".raw");
      check_case(name, [&] {
        const int64_t t = 7, e = 24, k = 4;
        Buf logits(d, {t, e}), bias(DType::kF32, {e}), ids(DType::kI32, {t, k}), w(DType::kF32, {t, k});
        fill(logits, 37, -4.f, 4.f, Edges::kNone);
        fill(bias, 38, -0.2f, 0.2f, Edges::kNone);
        set_float(logits, 2 * e + 3, std::numeric_limits<float>::quiet_NaN());
        set_float(logits, 2 * e + 7, std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < e; ++j) set_float(logits, 4 * e + j, j % 3 == 0 ? 1.5f : 0.25f);
        CaseResult r;
        const ops::GroupedTopkParams p{4, 2, norm, 2.5f};
        if (op_ok(ops::grouped_topk_router(logits.view(), bias.view(), p, ids.view(), w.view()), r)) {
          r.outputs.push_back(output_of(ids));
          r.outputs.push_back(output_of(w));
        }
        return r;
      });
    }
  }
}

// DeepSeek-V4 routing: E = 24, k = 4; top-k without and with a bias, and hash ids (repeats included); row 2
// holds NaN and infinities, row 4 ties.
TEST(CrossCpu, sqrt_softplus_router) {
  for (DType d : kFloatTypes) {
    for (int mode : {0, 1, 2}) {  // top-k, top-k with bias, hash ids
      for (bool norm : {false, true}) {
        const char* tags[] = {".topk", ".bias", ".hash"};
        const std::string name = "sqrt_softplus_router." + dt(d) + tags[mode] + (norm ? ".norm" : ".raw");
        check_case(name, [&] {
          const int64_t t = 7, e = 24, k = 4;
          Buf logits(d, {t, e}), bias(DType::kF32, {e}), hash(DType::kI32, {t, k}), ids(DType::kI32, {t, k}),
              w(DType::kF32, {t, k});
          fill(logits, 39, -8.f, 24.f, Edges::kNone);
          fill(bias, 40, -0.5f, 0.5f, Edges::kNone);
          Gen g(41);
          for (int64_t j = 0; j < t * k; ++j) hash.as<int32_t>()[j] = static_cast<int32_t>(g.next() % e);
          set_float(logits, 2 * e + 3, std::numeric_limits<float>::quiet_NaN());
          set_float(logits, 2 * e + 7, std::numeric_limits<float>::infinity());
          set_float(logits, 2 * e + 8, -std::numeric_limits<float>::infinity());
          for (int64_t j = 0; j < e; ++j) set_float(logits, 4 * e + j, j % 3 == 0 ? 1.5f : 0.25f);
          CaseResult r;
          if (op_ok(ops::sqrt_softplus_router(logits.view(), mode == 1 ? bias.view() : TensorView(),
                                              mode == 2 ? hash.view() : TensorView(), norm, 1.5f, ids.view(), w.view()),
                    r)) {
            r.outputs.push_back(output_of(ids));
            r.outputs.push_back(output_of(w));
          }
          return r;
        });
      }
    }
  }
}

// Rows of 83 elements (tail 3) with edge values, one all-zero row; x strided in the fp32 case.
enum class NormKind { kRms, kAddRms, kGemma, kAddGemma };
void norm_cases(NormKind kind, const std::string& op) {
  for (DType d : kFloatTypes) {
    const std::string name = op + "." + dt(d);
    check_case(name, [&] {
      const int64_t rows = 6, n = 83;
      Buf x(d, {rows, n}, d == DType::kF32 ? n + 7 : 0), g(d, {n}), res(d, {rows, n}), y(d, {rows, n}),
          sum(d, {rows, n}), rstd(DType::kF32, {rows, 1});
      fill(x, 41);
      for (int64_t j = 0; j < n; ++j) set_float(x, 3 * (d == DType::kF32 ? n + 7 : n) + j, 0.f);
      fill(g, 42, -1.5f, 1.5f, Edges::kNone);
      fill(res, 43);
      CaseResult r;
      Status st;
      switch (kind) {
        case NormKind::kRms: st = ops::rms_norm(x.view(), g.view(), 1e-6f, y.view(), rstd.view()); break;
        case NormKind::kGemma: st = ops::gemma_rms_norm(x.view(), g.view(), 1e-6f, y.view(), rstd.view()); break;
        case NormKind::kAddRms: st = ops::add_rms_norm(x.view(), g.view(), res.view(), 1e-6f, y.view(), sum.view()); break;
        case NormKind::kAddGemma:
          st = ops::add_gemma_rms_norm(x.view(), g.view(), res.view(), 1e-6f, y.view(), sum.view());
          break;
      }
      if (op_ok(st, r)) {
        r.outputs.push_back(output_of(y));
        r.outputs.push_back(kind == NormKind::kRms || kind == NormKind::kGemma ? output_of(rstd) : output_of(sum));
      }
      return r;
    });
  }
}
TEST(CrossCpu, rms_norm) { norm_cases(NormKind::kRms, "rms_norm"); }
TEST(CrossCpu, add_rms_norm) { norm_cases(NormKind::kAddRms, "add_rms_norm"); }
TEST(CrossCpu, gemma_rms_norm) { norm_cases(NormKind::kGemma, "gemma_rms_norm"); }
TEST(CrossCpu, add_gemma_rms_norm) { norm_cases(NormKind::kAddGemma, "add_gemma_rms_norm"); }

// D = 38 (19 pairs: a tail) and D = 128, positions up to 100000 (large angles).
TEST(CrossCpu, rope) {
  for (DType d : kFloatTypes) {
    for (int64_t hd : {38, 128}) {
      const std::string name = "rope." + dt(d) + ".d" + std::to_string(hd);
      check_case(name, [&] {
        const int64_t t = 5;
        Buf pos(DType::kI32, {t}), q(d, {t, 3, hd}), k(d, {t, 2, hd});
        const int32_t positions[t] = {0, 1, 17, 4095, 100000};
        for (int64_t i = 0; i < t; ++i) pos.as<int32_t>()[i] = positions[i];
        fill(q, 51);
        fill(k, 52);
        CaseResult r;
        if (op_ok(ops::rope(pos.view(), q.view(), k.view(), 10000.f), r)) {
          r.outputs.push_back(output_of(q));
          r.outputs.push_back(output_of(k));
        }
        return r;
      });
    }
  }
}

// d = 53 (tail 5); gates up to +-90 (exp over- and underflow) and edge values.
TEST(CrossCpu, silu_and_mul) {
  for (DType xd : kFloatTypes) {
    for (DType yd : kFloatTypes) {
      const std::string name = "silu_and_mul.x_" + dt(xd) + ".y_" + dt(yd);
      check_case(name, [&] {
        const int64_t t = 5, d = 53;
        Buf x(xd, {t, 2 * d}), y(yd, {t, d});
        fill(x, 61, -9.f, 9.f);
        set_float(x, 1, 90.f);
        set_float(x, 2, -90.f);
        CaseResult r;
        if (op_ok(ops::silu_and_mul(x.view(), y.view()), r)) r.outputs.push_back(output_of(y));
        return r;
      });
    }
  }
}

// KV caches: 6 blocks of 16 tokens, 2 kv heads. Two sequences: context 21 (blocks 4, 1) and 37 (blocks
// 2, 5, 3); every context position is written by the format's writer from fp32/bf16/fp16 key/value rows.
constexpr int64_t kBlocks = 6, kBlockSize = 16, kKvHeads = 2;
constexpr int32_t kTable[2][3] = {{4, 1, 0}, {2, 5, 3}};
constexpr int32_t kContext[2] = {21, 37};
constexpr int64_t kTokens = kContext[0] + kContext[1];

struct KvCaches {
  Buf k, v, ks, vs;
  KvCaches(ops::KvCacheFormat f, int64_t hd)
      : k(f == ops::KvCacheFormat::kBf16 ? DType::kBF16 : f == ops::KvCacheFormat::kInt8Fp16Scale ? DType::kI8 : DType::kU8,
          {kBlocks, kKvHeads, kBlockSize, f == ops::KvCacheFormat::kFp8Fp32PackedScale ? hd + 4 : hd}),
        v(k),
        ks(DType::kF16, {kBlocks, kKvHeads, kBlockSize}),
        vs(DType::kF16, {kBlocks, kKvHeads, kBlockSize}) {}
  ops::PagedKvCache view(ops::KvCacheFormat f) {
    return {.format = f, .key_cache = k.view(), .value_cache = v.view(), .key_scale_cache = ks.view(),
            .value_scale_cache = vs.view()};
  }
};

// Writes every context position of both sequences; returns the writer's status.
Status write_kv(ops::KvCacheFormat f, DType src, int64_t hd, KvCaches& c) {
  Buf key(src, {kTokens, kKvHeads, hd}), value(src, {kTokens, kKvHeads, hd});
  fill(key, 71 + static_cast<uint64_t>(hd), -3.f, 3.f);
  fill(value, 72 + static_cast<uint64_t>(hd), -3.f, 3.f);
  Buf flat(DType::kI32, {kTokens}), pairs(DType::kI32, {kTokens, 2});
  int64_t tok = 0;
  for (int s = 0; s < 2; ++s) {
    for (int32_t p = 0; p < kContext[s]; ++p, ++tok) {
      const int32_t block = kTable[s][p / kBlockSize], off = p % kBlockSize;
      flat.as<int32_t>()[tok] = block * static_cast<int32_t>(kBlockSize) + off;
      pairs.as<int32_t>()[2 * tok] = block;
      pairs.as<int32_t>()[2 * tok + 1] = off;
    }
  }
  switch (f) {
    case ops::KvCacheFormat::kBf16:
      return ops::bf16_kv_write(key.view(), value.view(), flat.view(), c.k.view(), c.v.view());
    case ops::KvCacheFormat::kInt8Fp16Scale:
      return ops::int8_kv_write(key.view(), value.view(), pairs.view(), c.k.view(), c.v.view(), c.ks.view(),
                                c.vs.view());
    case ops::KvCacheFormat::kFp8Fp32PackedScale:
      return ops::fp8_kv_write(key.view(), value.view(), flat.view(), c.k.view(), c.v.view());
  }
  return ok_status();
}

constexpr std::array<ops::KvCacheFormat, 3> kFormats = {ops::KvCacheFormat::kBf16, ops::KvCacheFormat::kInt8Fp16Scale,
                                                        ops::KvCacheFormat::kFp8Fp32PackedScale};
std::string format_tag(ops::KvCacheFormat f) {
  return f == ops::KvCacheFormat::kBf16 ? "bf16" : f == ops::KvCacheFormat::kInt8Fp16Scale ? "int8" : "fp8";
}

TEST(CrossCpu, kv_write) {
  for (ops::KvCacheFormat f : kFormats) {
    for (DType src : kFloatTypes) {
      const std::string name = format_tag(f) + "_kv_write." + dt(src) + ".d80";
      check_case(name, [&] {
        KvCaches c(f, 80);
        CaseResult r;
        if (op_ok(write_kv(f, src, 80, c), r)) {
          r.outputs.push_back(output_of(c.k));
          r.outputs.push_back(output_of(c.v));
          if (f == ops::KvCacheFormat::kInt8Fp16Scale) {
            r.outputs.push_back(output_of(c.ks));
            r.outputs.push_back(output_of(c.vs));
          }
        }
        return r;
      });
    }
  }
}

// 4 query heads over 2 kv heads (GQA); sequence 0 decodes one token, sequence 1 three (causal).
TEST(CrossCpu, paged_decode) {
  for (ops::KvCacheFormat f : kFormats) {
    for (int64_t hd : {64, 80, 256}) {
      for (DType qd : {DType::kF32, DType::kBF16}) {
        const std::string name = "paged_decode." + format_tag(f) + ".d" + std::to_string(hd) + ".q_" + dt(qd);
        check_case(name, [&] {
          CaseResult r;
          KvCaches c(f, hd);
          if (!op_ok(write_kv(f, DType::kF32, hd, c), r)) return r;
          const int64_t nq = 4, heads = 4;
          Buf q(qd, {nq, heads, hd}), out(qd, {nq, heads, hd}), bt(DType::kI32, {2, 3}), cl(DType::kI32, {2}),
              qsl(DType::kI32, {3});
          fill(q, 81, -2.f, 2.f, Edges::kNone);
          for (int s = 0; s < 2; ++s) {
            for (int b = 0; b < 3; ++b) bt.as<int32_t>()[s * 3 + b] = kTable[s][b];
            cl.as<int32_t>()[s] = kContext[s];
          }
          const int32_t loc[3] = {0, 1, 4};
          for (int i = 0; i < 3; ++i) qsl.as<int32_t>()[i] = loc[i];
          if (op_ok(ops::paged_decode(q.view(), c.view(f), bt.view(), cl.view(), qsl.view(),
                                      1.0f / std::sqrt(static_cast<float>(hd)), out.view()),
                    r)) {
            r.outputs.push_back(output_of(out));
          }
          return r;
        });
      }
    }
  }
}

// Rows of 75 (tail 11): an all-zero row, a row with NaN, a row with infinities, edge values elsewhere.
TEST(CrossCpu, dynamic_quant_per_token) {
  for (DType d : kFloatTypes) {
    const std::string name = "dynamic_quant_per_token." + dt(d);
    check_case(name, [&] {
      const int64_t rows = 6, n = 75;
      Buf x(d, {rows, n}), q(DType::kI8, {rows, n}), s(DType::kF32, {rows});
      fill(x, 91);
      for (int64_t j = 0; j < n; ++j) set_float(x, j, 0.f);
      set_float(x, 2 * n + 5, std::numeric_limits<float>::quiet_NaN());
      set_float(x, 3 * n + 6, -std::numeric_limits<float>::infinity());
      CaseResult r;
      if (op_ok(ops::dynamic_quant_per_token(x.view(), 1e-10f, q.view(), s.view()), r)) {
        r.outputs.push_back(output_of(q));
        r.outputs.push_back(output_of(s));
      }
      return r;
    });
  }
}

// Rows of 100 (blocks 32, 32, 32, 4: a short last block and an odd scale slot); one block holds NaN.
TEST(CrossCpu, dynamic_mx_quant) {
  struct Cfg {
    DType dst;
    ops::MxScaleAlg alg;
    bool round;
    const char* tag;
  };
  const Cfg cfgs[] = {{DType::kFp8E4M3FN, ops::MxScaleAlg::kOcpFloor, false, "e4m3.ocp"},
                      {DType::kFp8E4M3FN, ops::MxScaleAlg::kCeil, false, "e4m3.ceil"},
                      {DType::kFp8E5M2, ops::MxScaleAlg::kBiasedExponent, true, "e5m2.biased_round"},
                      {DType::kFp4E2M1x2, ops::MxScaleAlg::kOcpFloor, false, "e2m1.ocp"},
                      {DType::kFp4E2M1x2, ops::MxScaleAlg::kBiasedExponent, false, "e2m1.biased"}};
  for (DType d : kFloatTypes) {
    for (const Cfg& cfg : cfgs) {
      const std::string name = std::string("dynamic_mx_quant.") + dt(d) + "." + cfg.tag;
      check_case(name, [&] {
        const int64_t rows = 3, k = 100;
        const bool fp4 = cfg.dst == DType::kFp4E2M1x2;
        Buf x(d, {rows, k}), q(cfg.dst, {rows, fp4 ? k / 2 : k}),
            s(DType::kE8M0, {rows, ops::mx_scale_pairs(k, 32), 2});
        fill(x, 101, -5.f, 5.f);
        set_float(x, k + 40, std::numeric_limits<float>::quiet_NaN());
        ops::MxQuantConfig mc{.block_size = 32, .dst = cfg.dst, .scale_alg = cfg.alg, .round_scale = cfg.round};
        CaseResult r;
        if (op_ok(ops::dynamic_mx_quant(x.view(), mc, q.view(), s.view()), r)) {
          r.outputs.push_back(output_of(q));
          r.outputs.push_back(output_of(s));
        }
        return r;
      });
    }
  }
}

// Every code pattern appears (random bytes: NaN codes included), scales random with one 0xFF block.
TEST(CrossCpu, mx_dequant) {
  for (DType src : {DType::kFp8E4M3FN, DType::kFp8E5M2, DType::kFp4E2M1x2}) {
    for (DType yd : kFloatTypes) {
      const std::string name = std::string("mx_dequant.") + std::string(dtype_name(src)) + ".y_" + dt(yd);
      check_case(name, [&] {
        const int64_t rows = 3, k = 160;
        const bool fp4 = src == DType::kFp4E2M1x2;
        Buf q(src, {rows, fp4 ? k / 2 : k}), s(DType::kE8M0, {rows, ops::mx_scale_pairs(k, 32), 2}), y(yd, {rows, k});
        fill_bytes(q, 111);
        Gen g(112);
        for (auto& b : s.bytes()) b = static_cast<std::byte>(100 + g.next() % 50);
        s.bytes()[3] = std::byte{0xFF};
        CaseResult r;
        if (op_ok(ops::mx_dequant(q.view(), s.view(), 32, y.view()), r)) r.outputs.push_back(output_of(y));
        return r;
      });
    }
  }
}

TEST(CrossCpu, normalize_mx_scale_layout) {
  check_case("normalize_mx_scale_layout", [] {
    Buf s(DType::kE8M0, {3, 7}), out(DType::kE8M0, {3, 4, 2});
    fill_bytes(s, 121);
    CaseResult r;
    if (op_ok(ops::normalize_mx_scale_layout(s.view(), out.view()), r)) r.outputs.push_back(output_of(out));
    return r;
  });
}

// ---- MLA + DSA: MLA / indexer writers, mla_decode, sparse_mla_decode, lightning_indexer,
// layer_norm. The sequences and block tables of the KV cases above; kv_lora_rank 256 (fp8: two tiles; the
// bf16 and int8 cases also at 200, a tail), rope 40, index_head_dim 64. ----

constexpr std::array<ops::MlaKvFormat, 4> kMlaFormats = {
    ops::MlaKvFormat::kBf16, ops::MlaKvFormat::kInt8Fp16ScaleSplitRope, ops::MlaKvFormat::kFp8TileScalePacked,
    ops::MlaKvFormat::kMxfp8RopeFirstPacked};
std::string mla_tag(ops::MlaKvFormat f) {
  return f == ops::MlaKvFormat::kBf16                    ? "bf16"
         : f == ops::MlaKvFormat::kInt8Fp16ScaleSplitRope ? "int8"
         : f == ops::MlaKvFormat::kFp8TileScalePacked     ? "fp8"
                                                          : "mxfp8";
}

struct MlaBufs {
  Buf kv, scale, rope;
  ops::MlaKvCache cache;
  MlaBufs(ops::MlaKvFormat f, int64_t L, int64_t R)
      : kv(f == ops::MlaKvFormat::kBf16 ? DType::kBF16 : f == ops::MlaKvFormat::kInt8Fp16ScaleSplitRope ? DType::kI8
                                                                                                       : DType::kU8,
           {kBlocks, kBlockSize,
            ops::mla_kv_row_bytes(f, L, R).main / (f == ops::MlaKvFormat::kBf16 ? 2 : 1)}),
        scale(DType::kF16, {kBlocks, kBlockSize}),
        rope(DType::kBF16, {kBlocks, kBlockSize, R}) {
    cache = {f, L, R, kv.view(), scale.view(), rope.view()};
  }
};

void token_slots(Buf& flat, Buf& pairs) {
  int64_t tok = 0;
  for (int s = 0; s < 2; ++s) {
    for (int32_t p = 0; p < kContext[s]; ++p, ++tok) {
      const int32_t block = kTable[s][p / kBlockSize], off = p % kBlockSize;
      flat.as<int32_t>()[tok] = block * static_cast<int32_t>(kBlockSize) + off;
      pairs.as<int32_t>()[2 * tok] = block;
      pairs.as<int32_t>()[2 * tok + 1] = off;
    }
  }
}

Status write_mla(ops::MlaKvFormat f, DType src, MlaBufs& c, int64_t L, int64_t R) {
  Buf latent(src, {kTokens, L}), rope(src, {kTokens, R}), flat(DType::kI32, {kTokens}), pairs(DType::kI32, {kTokens, 2});
  fill(latent, 131 + static_cast<uint64_t>(L), -3.f, 3.f);
  fill(rope, 132, -3.f, 3.f);
  token_slots(flat, pairs);
  switch (f) {
    case ops::MlaKvFormat::kBf16: return ops::bf16_mla_kv_write(latent.view(), rope.view(), flat.view(), c.cache);
    case ops::MlaKvFormat::kInt8Fp16ScaleSplitRope:
      return ops::int8_mla_kv_write(latent.view(), rope.view(), pairs.view(), c.cache);
    case ops::MlaKvFormat::kFp8TileScalePacked:
      return ops::fp8_mla_kv_write(latent.view(), rope.view(), flat.view(), c.cache);
    case ops::MlaKvFormat::kMxfp8RopeFirstPacked:
      return ops::mxfp8_mla_kv_write(latent.view(), rope.view(), flat.view(), c.cache);
  }
  return ok_status();
}

std::vector<int64_t> mla_latents(ops::MlaKvFormat f) {
  if (f == ops::MlaKvFormat::kMxfp8RopeFirstPacked) return {192};  // groups of 64
  return f == ops::MlaKvFormat::kFp8TileScalePacked ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 200};
}

TEST(CrossCpu, mla_kv_write) {
  for (ops::MlaKvFormat f : kMlaFormats) {
    for (int64_t L : mla_latents(f)) {
      for (DType src : kFloatTypes) {
        check_case(mla_tag(f) + "_mla_kv_write." + dt(src) + ".L" + std::to_string(L), [&] {
          MlaBufs c(f, L, 40);
          CaseResult r;
          if (op_ok(write_mla(f, src, c, L, 40), r)) {
            r.outputs.push_back(output_of(c.kv));
            if (f == ops::MlaKvFormat::kInt8Fp16ScaleSplitRope) {
              r.outputs.push_back(output_of(c.scale));
              r.outputs.push_back(output_of(c.rope));
            }
          }
          return r;
        });
      }
    }
  }
}

// 20 heads (work items of 8, 8 and 4 heads); sequence 0 decodes one token, sequence 1 three (causal). The sparse
// case selects a fixed pattern of positions (and -1 pads) in both index contracts.
TEST(CrossCpu, mla_decode_and_sparse_mla_decode) {
  for (ops::MlaKvFormat f : kMlaFormats) {
    for (int64_t L : mla_latents(f)) {
      for (bool sparse : {false, true}) {
        const std::string name = std::string(sparse ? "sparse_mla_decode." : "mla_decode.") + mla_tag(f) + ".L" +
                                 std::to_string(L);
        check_case(name, [&] {
          CaseResult r;
          const int64_t R = 40, heads = 20, nq = 4, topk = 12;
          MlaBufs c(f, L, R);
          if (!op_ok(write_mla(f, DType::kF32, c, L, R), r)) return r;
          Buf ql(DType::kBF16, {nq, heads, L}), qr(DType::kF32, {nq, heads, R}), out(DType::kF32, {nq, heads, L}),
              bt(DType::kI32, {2, 3}), cl(DType::kI32, {2}), qsl(DType::kI32, {3}), idx(DType::kI32, {nq, topk});
          fill(ql, 141, -2.f, 2.f, Edges::kNone);
          fill(qr, 142, -2.f, 2.f, Edges::kNone);
          for (int s = 0; s < 2; ++s) {
            for (int b = 0; b < 3; ++b) bt.as<int32_t>()[s * 3 + b] = kTable[s][b];
            cl.as<int32_t>()[s] = kContext[s];
          }
          const int32_t loc[3] = {0, 1, 4};
          for (int i = 0; i < 3; ++i) qsl.as<int32_t>()[i] = loc[i];
          for (int64_t t = 0; t < nq; ++t) {
            const int32_t pos = t == 0 ? 20 : 33 + static_cast<int32_t>(t);
            for (int64_t j = 0; j < topk; ++j) {
              idx.as<int32_t>()[t * topk + j] = j % 5 == 4 ? -1 : static_cast<int32_t>((pos * 7 + 3 * j) % (pos + 1));
            }
          }
          const Status st =
              sparse ? ops::sparse_mla_decode(ql.view(), qr.view(), c.cache, idx.view(),
                                              ops::TopkIndexFormat::kSequencePositions, bt.view(), cl.view(), qsl.view(),
                                              0.07f, out.view())
                     : ops::mla_decode(ql.view(), qr.view(), c.cache, bt.view(), cl.view(), qsl.view(), 0.07f, out.view());
          if (op_ok(st, r)) r.outputs.push_back(output_of(out));
          return r;
        });
      }
    }
  }
}

// DeepSeek-V4: window + compressed rows of the MLA caches above (one cache for both lists) with sinks, 20 heads;
// the compressor at ratio 4 with overlap (D 40: a tail) and ratio 8 without, bf16 and strided fp32 inputs.
TEST(CrossCpu, sharedkv_sparse_attention) {
  for (ops::MlaKvFormat f : kMlaFormats) {
    const int64_t L = mla_latents(f)[0], R = 40;
    check_case("sharedkv_sparse_attention." + mla_tag(f) + ".L" + std::to_string(L), [&] {
      CaseResult r;
      const int64_t heads = 20, nq = 4, W = 9, C = 7;
      MlaBufs c(f, L, R);
      if (!op_ok(write_mla(f, DType::kF32, c, L, R), r)) return r;
      Buf qn(DType::kBF16, {nq, heads, L}), qr(DType::kF32, {nq, heads, R}), out(DType::kF32, {nq, heads, L + R}),
          win(DType::kI32, {nq, W}), cmp(DType::kI32, {nq, C}), sinks(DType::kF32, {heads});
      fill(qn, 161, -2.f, 2.f, Edges::kNone);
      fill(qr, 162, -2.f, 2.f, Edges::kNone);
      fill(sinks, 163, -1.f, 3.f, Edges::kNone);
      for (int64_t i = 0; i < nq * W; ++i) win.as<int32_t>()[i] = i % 4 == 3 ? -1 : static_cast<int32_t>((i * 5) % kTokens);
      for (int64_t i = 0; i < nq * C; ++i) cmp.as<int32_t>()[i] = static_cast<int32_t>((i * 11 + 2) % kTokens);
      // Flat slots of the written tokens: the first sequence's block table covers its tokens.
      for (int64_t i = 0; i < nq * W; ++i) {
        int32_t& v = win.as<int32_t>()[i];
        if (v >= 0) v = kTable[0][v % kContext[0] / kBlockSize] * static_cast<int32_t>(kBlockSize) + v % kContext[0] % kBlockSize;
      }
      for (int64_t i = 0; i < nq * C; ++i) {
        int32_t& v = cmp.as<int32_t>()[i];
        v = kTable[0][v % kContext[0] / kBlockSize] * static_cast<int32_t>(kBlockSize) + v % kContext[0] % kBlockSize;
      }
      if (op_ok(ops::sharedkv_sparse_attention(qn.view(), qr.view(), c.cache, win.view(), c.cache, cmp.view(),
                                               sinks.view(), 0.07f, out.view()),
                r)) {
        r.outputs.push_back(output_of(out));
      }
      return r;
    });
  }
}

TEST(CrossCpu, kv_compress) {
  for (DType src : kFloatTypes) {
    for (bool overlap : {true, false}) {
      check_case(std::string("kv_compress.") + dt(src) + (overlap ? ".overlap" : ""), [&] {
        CaseResult r;
        const int64_t ratio = overlap ? 4 : 8, D = 40, coff = overlap ? 2 : 1, windows = 3;
        const int64_t rows = (windows + (overlap ? 1 : 0)) * ratio;
        Buf kv(src, {rows, coff * D}), gate(src, {rows, coff * D}, coff * D + 3), ape(DType::kF32, {ratio, coff * D}),
            out(DType::kF32, {windows, D});
        fill(kv, 171, -3.f, 3.f, Edges::kNone);
        fill(gate, 172, -6.f, 6.f, Edges::kNone);
        fill(ape, 173, -1.f, 1.f, Edges::kNone);
        if (op_ok(ops::kv_compress(kv.view(), gate.view(), ape.view(), ratio, overlap, overlap, out.view()), r)) {
          r.outputs.push_back(output_of(out));
        }
        return r;
      });
    }
  }
}

TEST(CrossCpu, indexer_key_write_and_lightning_indexer) {
  for (ops::IndexerKeyFormat f : {ops::IndexerKeyFormat::kBf16, ops::IndexerKeyFormat::kFp8HadamardPackedScale}) {
    const std::string tag = f == ops::IndexerKeyFormat::kBf16 ? "bf16" : "fp8";
    check_case("lightning_indexer." + tag, [&] {
      CaseResult r;
      const int64_t D = 64, heads = 3, nq = 4, topk = 10;
      const bool fp8 = f == ops::IndexerKeyFormat::kFp8HadamardPackedScale;
      Buf keys(fp8 ? DType::kU8 : DType::kBF16, {kBlocks, kBlockSize, fp8 ? D + 4 : D}), k(DType::kF32, {kTokens, D}),
          flat(DType::kI32, {kTokens}), pairs(DType::kI32, {kTokens, 2});
      fill(k, 151, -2.f, 2.f);
      token_slots(flat, pairs);
      const ops::IndexerKeyCache cache{f, D, keys.view()};
      const Status wst = fp8 ? ops::fp8_indexer_key_write(k.view(), flat.view(), cache)
                             : ops::bf16_indexer_key_write(k.view(), flat.view(), cache);
      if (!op_ok(wst, r)) return r;
      r.outputs.push_back(output_of(keys));
      Buf q(DType::kF32, {nq, heads, D}), w(DType::kF32, {nq, heads}), bt(DType::kI32, {2, 3}), cl(DType::kI32, {2}),
          qsl(DType::kI32, {3}), idx(DType::kI32, {nq, topk}), sc(DType::kF32, {nq, topk});
      fill(q, 152, -2.f, 2.f, Edges::kNone);
      fill(w, 153, 0.f, 1.f, Edges::kNone);
      for (int s = 0; s < 2; ++s) {
        for (int b = 0; b < 3; ++b) bt.as<int32_t>()[s * 3 + b] = kTable[s][b];
        cl.as<int32_t>()[s] = kContext[s];
      }
      const int32_t loc[3] = {0, 1, 4};
      for (int i = 0; i < 3; ++i) qsl.as<int32_t>()[i] = loc[i];
      if (op_ok(ops::lightning_indexer(q.view(), w.view(), cache, bt.view(), cl.view(), qsl.view(),
                                       ops::TopkIndexFormat::kFlatKvSlots, idx.view(), sc.view()),
                r)) {
        r.outputs.push_back(output_of(idx));
        r.outputs.push_back(output_of(sc));
      }
      return r;
    });
  }
}

TEST(CrossCpu, layer_norm) {
  for (DType xd : kFloatTypes) {
    check_case("layer_norm.x_" + dt(xd), [&] {
      const int64_t rows = 4, d = 75;
      Buf x(xd, {rows, d}), g(DType::kF32, {d}), b(DType::kBF16, {d}), y(xd, {rows, d});
      fill(x, 161, -4.f, 4.f);
      fill(g, 162, 0.5f, 1.5f, Edges::kNone);
      fill(b, 163, -1.f, 1.f, Edges::kNone);
      CaseResult r;
      if (op_ok(ops::layer_norm(x.view(), g.view(), b.view(), 1e-6f, y.view()), r)) r.outputs.push_back(output_of(y));
      return r;
    });
  }
}

// ---- Gated DeltaNet (Qwen3.5 linear attention) ----
// Three sequences (q_len 1, 5 and 70: decode, a short chunked prefill and one past a 64-token chunk) in
// slots 2, 0, 1 of 3.
constexpr int32_t kGdnStarts[4] = {0, 1, 6, 76};
constexpr int32_t kGdnSlots[3] = {2, 0, 1};
constexpr int64_t kGdnTokens = 76;

void gdn_batch(Buf& si, Buf& qsl) {
  for (int i = 0; i < 3; ++i) si.as<int32_t>()[i] = kGdnSlots[i];
  for (int i = 0; i < 4; ++i) qsl.as<int32_t>()[i] = kGdnStarts[i];
}

// C = 300 (a 256-channel block, then 44: a 16-lane tail of 12), K = 4; edge values in x and the state.
TEST(CrossCpu, causal_conv1d) {
  for (DType xd : {DType::kF32, DType::kBF16}) {
    for (DType sd : {DType::kF32, DType::kBF16}) {
      check_case("causal_conv1d.x_" + dt(xd) + ".state_" + dt(sd), [&] {
        const int64_t C = 300, K = 4;
        Buf x(xd, {kGdnTokens, C}), w(xd, {C, K}), st(sd, {3, K - 1, C}), y(xd, {kGdnTokens, C}),
            si(DType::kI32, {3}), qsl(DType::kI32, {4});
        fill(x, 171, -4.f, 4.f);
        fill(w, 172, -1.f, 1.f, Edges::kNone);
        fill(st, 173, -4.f, 4.f);
        gdn_batch(si, qsl);
        CaseResult r;
        if (op_ok(ops::causal_conv1d(x.view(), w.view(), st.view(), si.view(), qsl.view(), y.view()), r)) {
          r.outputs.push_back(output_of(y));
          r.outputs.push_back(output_of(st));
        }
        return r;
      });
    }
  }
}

// nv = 37; a and b across softplus's threshold (20) and exp's over- and underflow.
TEST(CrossCpu, gdn_gating) {
  for (DType d : {DType::kF32, DType::kBF16}) {
    check_case("gdn_gating." + dt(d), [&] {
      const int64_t T = 7, nv = 37;
      Buf a(d, {T, nv}), b(d, {T, nv}), A(d, {nv}), bias(d, {nv}), g(DType::kF32, {T, nv}), beta(DType::kF32, {T, nv});
      fill(a, 181, -30.f, 30.f);
      fill(b, 182, -100.f, 100.f);
      fill(A, 183, 0.f, 2.8f, Edges::kNone);
      fill(bias, 184, -0.5f, 0.5f, Edges::kNone);
      CaseResult r;
      if (op_ok(ops::gdn_gating(a.view(), b.view(), A.view(), bias.view(), g.view(), beta.view()), r)) {
        r.outputs.push_back(output_of(g));
        r.outputs.push_back(output_of(beta));
      }
      return r;
    });
  }
}

// D = 131 (8 lane blocks and a tail of 3) and 128; one all-zero row.
TEST(CrossCpu, gated_rms_norm) {
  for (DType xd : {DType::kF32, DType::kBF16}) {
    for (int64_t d : {131, 128}) {
      check_case("gated_rms_norm.x_" + dt(xd) + ".d" + std::to_string(d), [&] {
        const int64_t rows = 5;
        Buf x(xd, {rows, d}), z(xd, {rows, d}), w(DType::kF32, {d}), y(xd, {rows, d});
        fill(x, 191, -3.f, 3.f);
        for (int64_t j = 0; j < d; ++j) set_float(x, 2 * d + j, 0.f);
        fill(z, 192, -9.f, 9.f);
        fill(w, 193, 0.5f, 1.5f, Edges::kNone);
        CaseResult r;
        if (op_ok(ops::gated_rms_norm(x.view(), z.view(), w.view(), 1e-6f, y.view()), r)) r.outputs.push_back(output_of(y));
        return r;
      });
    }
  }
}

// d = 53 (tail 5); gates with edge values (NaN and infinities included), in place in one case.
TEST(CrossCpu, sigmoid_mul) {
  for (DType xd : {DType::kF32, DType::kBF16}) {
    for (DType yd : {DType::kF32, DType::kBF16}) {
      check_case("sigmoid_mul.x_" + dt(xd) + ".y_" + dt(yd), [&] {
        const int64_t t = 5, d = 53;
        Buf x(xd, {t, d}), g(DType::kBF16, {t, d}), y(yd, {t, d});
        fill(x, 201, -9.f, 9.f);
        fill(g, 202, -90.f, 90.f, Edges::kNonFinite);
        CaseResult r;
        const bool in_place = xd == yd;
        if (op_ok(ops::sigmoid_mul(x.view(), g.view(), in_place ? x.view() : y.view()), r)) {
          r.outputs.push_back(output_of(in_place ? x : y));
        }
        return r;
      });
    }
  }
}

// nk = 2, nv = 4 (grouped values), dk = 40 and dv = 37 (tails of the 16-lane column blocks and of the
// register tiles); random states; the per-token form (q_len 1) and the chunked form (5 and 70 tokens).
TEST(CrossCpu, gated_delta_rule) {
  for (DType d : {DType::kF32, DType::kBF16}) {
    check_case("gated_delta_rule." + dt(d), [&] {
      const int64_t nk = 2, nv = 4, dk = 40, dv = 37;
      Buf q(d, {kGdnTokens, nk, dk}), k(d, {kGdnTokens, nk, dk}), v(d, {kGdnTokens, nv, dv}),
          g(DType::kF32, {kGdnTokens, nv}), beta(DType::kF32, {kGdnTokens, nv}), st(DType::kF32, {3, nv, dk, dv}),
          out(d, {kGdnTokens, nv, dv}), si(DType::kI32, {3}), qsl(DType::kI32, {4});
      fill(q, 211, -1.f, 1.f);
      fill(k, 212, -1.f, 1.f);
      fill(v, 213, -1.f, 1.f);
      fill(g, 214, -3.f, 0.f, Edges::kNone);
      fill(beta, 215, 0.f, 1.f, Edges::kNone);
      fill(st, 216, -0.5f, 0.5f, Edges::kNone);
      gdn_batch(si, qsl);
      CaseResult r;
      if (op_ok(ops::gated_delta_rule(q.view(), k.view(), v.view(), g.view(), beta.view(), st.view(), si.view(),
                                      qsl.view(), 1.0f / std::sqrt(40.0f), out.view()),
                r)) {
        r.outputs.push_back(output_of(out));
        r.outputs.push_back(output_of(st));
      }
      return r;
    });
  }
}

// ---- end MLA + DSA ----

// DeepSeek-V4's hyper-connections: n = 4 streams of H = 45 (tail 13), T = 1, 9 (fn rows split over the
// threads) and 70 (token blocks); 20 and 1 Sinkhorn iterations; n = 1.
TEST(CrossCpu, hyper_connection) {
  struct Shape {
    int64_t t, n, h, iters;
  };
  for (DType d : {DType::kBF16, DType::kF32}) {
    for (Shape sh : {Shape{1, 4, 45, 20}, Shape{9, 4, 45, 20}, Shape{70, 4, 45, 1}, Shape{3, 1, 45, 20}}) {
      const std::string tag =
          dt(d) + ".t" + std::to_string(sh.t) + ".n" + std::to_string(sh.n) + ".it" + std::to_string(sh.iters);
      const int64_t N = (2 + sh.n) * sh.n;
      Buf streams(d, {sh.t, sh.n, sh.h}), fn(DType::kF32, {N, sh.n * sh.h}), base(DType::kF32, {N}),
          scale(DType::kF32, {3}), y(d, {sh.t, sh.h});
      fill(streams, 221, -3.f, 3.f);
      fill(fn, 222, -0.15f, 0.15f, Edges::kNone);
      fill(base, 223, -1.f, 1.f, Edges::kNone);
      fill(scale, 224, 0.5f, 2.f, Edges::kNone);
      fill(y, 225, -3.f, 3.f);
      const ops::HyperConnectionParams p{1e-6f, 1e-6f, sh.iters};
      Buf collapsed(d, {sh.t, sh.h}), post(DType::kF32, {sh.t, sh.n}), comb(DType::kF32, {sh.t, sh.n, sh.n});
      check_case("hc_pre." + tag, [&] {
        CaseResult r;
        if (op_ok(ops::hc_pre(streams.view(), fn.view(), base.view(), scale.view(), p, collapsed.view(), post.view(),
                              comb.view()),
                  r)) {
          r.outputs.push_back(output_of(collapsed));
          r.outputs.push_back(output_of(post));
          r.outputs.push_back(output_of(comb));
        }
        return r;
      });
      check_case("hc_post." + tag, [&] {
        Buf out(d, {sh.t, sh.n, sh.h}), in_place(streams);
        CaseResult r;
        if (op_ok(ops::hc_post(y.view(), post.view(), comb.view(), streams.view(), out.view()), r) &&
            op_ok(ops::hc_post(y.view(), post.view(), comb.view(), in_place.view(), in_place.view()), r)) {
          r.outputs.push_back(output_of(out));
          r.outputs.push_back(output_of(in_place));
        }
        return r;
      });
      check_case("hc_head." + tag, [&] {
        Buf head(d, {sh.t, sh.h});
        const TensorView hf = TensorView(fn.view().data_as<float>(), DType::kF32, {sh.n, sh.n * sh.h});
        const TensorView hs = TensorView(scale.view().data_as<float>() + 1, DType::kF32, {1});
        CaseResult r;
        if (op_ok(ops::hc_head(streams.view(), hf, TensorView(base.view().data_as<float>(), DType::kF32, {sh.n}), hs, p,
                               head.view()),
                  r)) {
          r.outputs.push_back(output_of(head));
        }
        return r;
      });
    }
  }
}

}  // namespace
}  // namespace genbridge::cross_cpu
