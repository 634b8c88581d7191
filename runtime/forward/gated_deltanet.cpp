#include "runtime/forward/gated_deltanet.h"

#include <fmt/format.h>

#include <cmath>

#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear_attention/causal_conv1d.h"
#include "genbridge/ops/linear_attention/gated_delta_rule.h"
#include "genbridge/ops/linear_attention/gdn_gating.h"
#include "genbridge/ops/norm/gated_rms_norm.h"
#include "runtime/forward/deepseek_attention.h"

namespace genbridge::model {

// The pre-conv rows stay bf16 (the conv state keeps them exactly); what follows the conv, the output gate z and
// the gated norm's output stay fp32 up to out_proj, as fused Gated DeltaNet kernels keep them in registers.
struct GatedDeltaNet::Scratch {
  std::vector<bf16_t> mixed;
  std::vector<float> z, normed, conv, a, b, o, g, beta;
  int64_t max_tokens = 0;
};

Result<std::unique_ptr<GatedDeltaNet>> GatedDeltaNet::create(const Checkpoint& checkpoint,
                                                             const runtime::DeviceOperator& dev,
                                                             const runtime::KvPagePool& pool) {
  const ModelConfig& c = checkpoint.config();
  if (!c.is_qwen35()) return invalid_argument("GatedDeltaNet: the model has no linear-attention layers");
  std::unique_ptr<GatedDeltaNet> n(new GatedDeltaNet(checkpoint));
  const runtime::KvModelShape shape = kv_model_shape(c);
  if (pool.num_state_slots() < 1) {
    return invalid_argument("GatedDeltaNet: the KV pool has no state slots (create it with num_state_slots >= 1)");
  }
  int64_t s = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_linear_layer(l)) {
      n->state_index_.push_back(-1);
      continue;
    }
    GB_ASSIGN_OR_RETURN(runtime::LinearStateCache view, dev.state_layer_view(pool, shape, s));
    n->state_.push_back(view);
    n->state_index_.push_back(s++);
  }
  return n;
}

std::shared_ptr<GatedDeltaNet::Scratch> GatedDeltaNet::make_scratch(int64_t max_tokens) const {
  const Qwen35Config& q = config_.qwen35;
  const auto T = static_cast<size_t>(max_tokens);
  auto s = std::make_shared<Scratch>();
  s->max_tokens = max_tokens;
  s->mixed.resize(T * q.conv_dim());
  s->conv.resize(T * q.conv_dim());
  s->z.resize(T * q.value_dim());
  s->o.resize(T * q.value_dim());
  s->normed.resize(T * q.value_dim());
  for (auto* v : {&s->a, &s->b}) v->resize(T * q.linear_num_value_heads);
  for (auto* v : {&s->g, &s->beta}) v->resize(T * q.linear_num_value_heads);
  return s;
}

namespace {
Status ctx(Status s, const char* what) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}: {}", what, s.message()));
}
}  // namespace

Status GatedDeltaNet::forward(Scratch& sc, int64_t layer, const TensorView& h, const TensorView& state_slots,
                              const TensorView& query_start_loc, const TensorView& out) const {
  if (layer < 0 || layer >= static_cast<int64_t>(state_index_.size()) || state_index_[layer] < 0) {
    return invalid_argument(fmt::format("GatedDeltaNet: layer {} is not a linear-attention layer", layer));
  }
  const int64_t T = h.dim(0);
  if (T > sc.max_tokens) {
    return invalid_argument(fmt::format("GatedDeltaNet: {} tokens exceed the planned {}", T, sc.max_tokens));
  }
  const Qwen35Config& q = config_.qwen35;
  const LinearAttentionWeights& w = w_.layers[layer].gdn;
  const runtime::LinearStateCache& st = state_[state_index_[layer]];
  const int64_t C = q.conv_dim(), Kd = q.key_dim(), nk = q.linear_num_key_heads, nv = q.linear_num_value_heads,
                dk = q.linear_key_head_dim, dv = q.linear_value_head_dim;
  const TensorView mixed(sc.mixed.data(), DType::kBF16, {T, C});
  const TensorView z(sc.z.data(), DType::kF32, {T, nv, dv});
  const TensorView a(sc.a.data(), DType::kF32, {T, nv}), b(sc.b.data(), DType::kF32, {T, nv});
  GB_RETURN_IF_ERROR(ctx(ops::linear(h, w.in_proj_qkv, mixed), "in_proj_qkv"));
  GB_RETURN_IF_ERROR(ctx(ops::linear(h, w.in_proj_z, TensorView(sc.z.data(), DType::kF32, {T, nv * dv})), "in_proj_z"));
  GB_RETURN_IF_ERROR(ctx(ops::linear(h, w.in_proj_b, b), "in_proj_b"));
  GB_RETURN_IF_ERROR(ctx(ops::linear(h, w.in_proj_a, a), "in_proj_a"));
  const TensorView conv(sc.conv.data(), DType::kF32, {T, C});
  GB_RETURN_IF_ERROR(
      ctx(ops::causal_conv1d(mixed, w.conv1d, st.conv, state_slots, query_start_loc, conv), "causal_conv1d"));
  // q, k, v: views of the conv output's [q | k | v] columns, head-major within each.
  float* x = sc.conv.data();
  const TensorView qv = TensorView::strided(x, DType::kF32, {T, nk, dk}, {C, dk, 1}),
                   kv = TensorView::strided(x + Kd, DType::kF32, {T, nk, dk}, {C, dk, 1}),
                   vv = TensorView::strided(x + 2 * Kd, DType::kF32, {T, nv, dv}, {C, dv, 1});
  const TensorView g(sc.g.data(), DType::kF32, {T, nv}), beta(sc.beta.data(), DType::kF32, {T, nv});
  GB_RETURN_IF_ERROR(ctx(ops::gdn_gating(a, b, w.A_log, w.dt_bias, g, beta), "gdn_gating"));
  const TensorView o(sc.o.data(), DType::kF32, {T, nv, dv});
  GB_RETURN_IF_ERROR(ctx(ops::gated_delta_rule(qv, kv, vv, g, beta, st.recurrent, state_slots, query_start_loc,
                                               1.0f / std::sqrt(static_cast<float>(dk)), o),
                         "gated_delta_rule"));
  const TensorView normed(sc.normed.data(), DType::kF32, {T, nv, dv});
  GB_RETURN_IF_ERROR(
      ctx(ops::gated_rms_norm(o, z, w.norm, static_cast<float>(config_.rms_norm_eps), normed), "gated_rms_norm"));
  return ctx(ops::linear(TensorView(sc.normed.data(), DType::kF32, {T, nv * dv}), w.out_proj, out), "out_proj");
}

}  // namespace genbridge::model
