#pragma once
// Internal: which KV representations this build's generation reads. The attention ops are common (their
// kernels read every representation); what a generation cannot read is its real difference, defined once
// per target tree (ops/target_providers/<Target>/attention/kv_reads.cpp). Each returns ok, or the
// Unimplemented sentence naming `op`, the representation and the generation (docs/design.md#provider-staging).

#include "genbridge/core/status.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

Status check_kv_readable(const char* op, KvCacheFormat format);
Status check_kv_readable(const char* op, MlaKvFormat format);
Status check_kv_readable(const char* op, IndexerKeyFormat format);

}  // namespace genbridge::ops::detail
