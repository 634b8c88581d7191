#pragma once
// The engine-job options of one AFD bit-identity case: `a` attention and `f` FFN ranks, `s` stages, the
// connector (async with async_dp), a 20 s deadline, logits recorded (to compare with the monolithic engine).

#include "afd/engine_job.h"

namespace genbridge::afd {

inline EngineJobOptions engine_job_case(ConnectorKind connector, int a, int f, int s) {
  EngineJobOptions o;
  o.afd.num_attention = a;
  o.afd.num_ffn = f;
  o.afd.num_stages = s;
  o.afd.connector = connector;
  o.afd.async_dp = connector == ConnectorKind::kAsync;
  o.afd.timeout_ms = 20000;
  o.engine.record_logits = true;
  return o;
}

}  // namespace genbridge::afd
