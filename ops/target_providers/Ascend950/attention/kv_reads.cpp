// Ascend950 (A5): the attention ops read every KV representation, the fp8 ones included.
#include "ops/common/attention/kv_reads.h"

namespace genbridge::ops::detail {

Status check_kv_readable(const char*, KvCacheFormat) { return ok_status(); }
Status check_kv_readable(const char*, MlaKvFormat) { return ok_status(); }
Status check_kv_readable(const char*, IndexerKeyFormat) { return ok_status(); }

}  // namespace genbridge::ops::detail
