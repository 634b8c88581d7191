// attention/paged_decode and attention/rope give the same bits on every CPU target this machine runs,
// and paged_decode's output for a sequence does not depend on the batch around it or
// on the thread count. Each case also prints an FNV-1a hash of its outputs, so that two builds (before
// and after a kernel change) can be compared bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/attention/rope.h"
#include "kv_harness.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

uint64_t fnv1a(const std::vector<std::byte>& b) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte x : b) h = (h ^ static_cast<uint8_t>(x)) * 1099511628211ull;
  return h;
}

std::vector<KvCacheFormat> build_formats() {
  std::vector<KvCacheFormat> f = {KvCacheFormat::kBf16, KvCacheFormat::kInt8Fp16Scale};
  if (fp8_supported()) f.push_back(KvCacheFormat::kFp8Fp32PackedScale);
  return f;
}

// Contexts cross 16-token pages and 64-key softmax chunks at lengths that are not multiples of 16; one
// sequence has a 21-token chunked-prefill step (rows of one item end at different positions).
const std::vector<int32_t> kCtx = {1, 15, 17, 63, 65, 130, 200};
const std::vector<int32_t> kQLen = {1, 1, 1, 1, 1, 21, 1};

TEST(PagedDecodeCpuTargets, same_bits_on_every_target) {
  for (KvCacheFormat f : build_formats()) {
    for (int64_t d : {64, 80, 128, 256}) {
      for (int64_t group : {1, 4}) {
        const int64_t kv_heads = 2, heads = kv_heads * group;
        SCOPED_TRACE(format_label(f) + " head_dim " + std::to_string(d) + " group " + std::to_string(group));
        Problem p = make_problem(heads, kv_heads, d, 16, kCtx, kQLen, 5 + d + group);
        TestCache cache(f, p.num_blocks, kv_heads, 16, d);
        ASSERT_TRUE(write_problem(cache, p).ok());
        std::vector<std::byte> first;
        std::string first_target;
        for_each_cpu_target([&](const std::string& t) {
          OwnedTensor out(DType::kF32, {p.num_query_tokens, heads, d});
          const Status st = run_attention(cache, p, out.view(), 0.125f);
          ASSERT_TRUE(st.ok()) << st.to_string();
          if (first.empty()) {
            first = out.bytes(), first_target = t;
            std::printf("[ paged_decode %s d=%lld group=%lld ] fnv1a %016llx\n", format_label(f).c_str(),
                        static_cast<long long>(d), static_cast<long long>(group),
                        static_cast<unsigned long long>(fnv1a(first)));
          } else {
            EXPECT_EQ(std::memcmp(first.data(), out.bytes().data(), first.size()), 0)
                << t << " differs from " << first_target;
          }
        });
      }
    }
  }
}

// Sequence s run alone (its own query rows, block table row and context length, same cache) gives the
// same bits as inside the batch of all sequences, with 1 and 2 threads.
TEST(PagedDecodeBatch, a_sequence_alone_equals_it_inside_a_batch) {
  const int threads_before = num_threads();
  for (KvCacheFormat f : build_formats()) {
    const int64_t d = 128, kv_heads = 2, heads = 8;
    SCOPED_TRACE(format_label(f));
    Problem p = make_problem(heads, kv_heads, d, 16, kCtx, kQLen, 99);
    TestCache cache(f, p.num_blocks, kv_heads, 16, d);
    ASSERT_TRUE(write_problem(cache, p).ok());
    const size_t row_bytes = static_cast<size_t>(heads * d) * sizeof(float);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      OwnedTensor batch_out(DType::kF32, {p.num_query_tokens, heads, d});
      ASSERT_TRUE(run_attention(cache, p, batch_out.view(), 0.125f).ok());
      for (size_t s = 0; s < p.ctx.size(); ++s) {
        const int64_t q0 = p.query_start_loc[s], qn = p.q_len[s];
        const size_t qrow = static_cast<size_t>(heads * d) * dtype_size(DType::kBF16);
        OwnedTensor q(DType::kBF16, {qn, heads, d});
        std::memcpy(q.data(), p.query->bytes().data() + q0 * qrow, static_cast<size_t>(qn) * qrow);
        std::vector<int32_t> table(p.block_tables.begin() + static_cast<int64_t>(s) * p.max_blocks,
                                   p.block_tables.begin() + static_cast<int64_t>(s + 1) * p.max_blocks);
        std::vector<int32_t> lens = {p.ctx[s]}, loc = {0, static_cast<int32_t>(qn)};
        OwnedTensor out(DType::kF32, {qn, heads, d});
        const Status st = ops::paged_decode(
            q.view(), cache.view(), TensorView(table.data(), DType::kI32, {1, p.max_blocks}),
            TensorView(lens.data(), DType::kI32, {1}), TensorView(loc.data(), DType::kI32, {2}), 0.125f, out.view());
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(std::memcmp(out.bytes().data(), batch_out.bytes().data() + q0 * row_bytes, qn * row_bytes), 0)
            << "sequence " << s << " with " << threads << " threads";
      }
    }
  }
  set_num_threads(threads_before);
}

TEST(RopeCpuTargets, same_bits_on_every_target) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t d : {64, 72, 128, 256}) {  // 72: half = 36, not a multiple of 16
      SCOPED_TRACE(std::string(dtype_name(dt)) + " head_dim " + std::to_string(d));
      const int64_t tokens = 5, hq = 4, hk = 2;
      std::vector<int64_t> pos = {0, 1, 7, 4095, 131071};
      const TensorView pv(pos.data(), DType::kI64, {tokens});
      OwnedTensor q0(dt, {tokens, hq, d}), k0(dt, {tokens, hk, d});
      fill_uniform(q0.view(), 3 + d);
      fill_uniform(k0.view(), 4 + d);
      std::vector<std::byte> first_q, first_k;
      for_each_cpu_target([&](const std::string& t) {
        OwnedTensor q(dt, {tokens, hq, d}), k(dt, {tokens, hk, d});
        q.bytes() = q0.bytes(), k.bytes() = k0.bytes();
        ASSERT_TRUE(ops::rope(pv, q.view(), k.view(), 10000.f).ok());
        if (first_q.empty()) {
          first_q = q.bytes(), first_k = k.bytes();
          std::printf("[ rope %s d=%lld ] fnv1a %016llx %016llx\n", dtype_name(dt).data(), static_cast<long long>(d),
                      static_cast<unsigned long long>(fnv1a(first_q)), static_cast<unsigned long long>(fnv1a(first_k)));
        } else {
          EXPECT_TRUE(q.bytes() == first_q) << t;
          EXPECT_TRUE(k.bytes() == first_k) << t;
        }
      });
    }
  }
}

}  // namespace
}  // namespace genbridge::testing
