#pragma once
// What every rank of an AFD job must agree on (afd::EngineJobOptions::fingerprint): the job compares
// these items across ranks at init, before what it adds itself (afd::job_fingerprint), and a mismatch ends
// the job naming the item and both values. `run` and `serve` share one list of the flags (serve's is the
// part that is not about prompts, sampling or warm-up).
// Items are named as the user typed the flag ("--max-new-tokens") or, for what the flags resolve to, by a
// plain name, with the flag it comes from where there is one ("model weights (--model)", "prompts").
// Every rank builds the same list of names in the same order, whatever flags it was given; a value that
// does not apply reads "(not given)".

#include <string>
#include <vector>

#include "afd/connector.h"
#include "genbridge/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/engine/engine.h"
#include "tools/commands.h"

namespace genbridge::tools {

// The identity of a checkpoint's weights, from their content rather than their time stamps: for every
// safetensors file (in the checkpoint's order) its name, its size, its whole header (tensor names,
// dtypes, shapes, offsets, metadata) and 64 samples of 4 KiB spread evenly over its data section (the
// whole data section when it is smaller), hashed with 64-bit FNV-1a. Why content: copies of one
// checkpoint on different nodes have different mtimes but must agree, and a file rewritten in place with
// its old mtime must not. Why sampled: the cost stays at the header plus 256 KiB per file whatever the
// model's size (a full checksum would read every byte of a large checkpoint on every rank at start-up).
// Limit: two checkpoints of the same shapes that differ only in bytes no sample covers look the same.
// Reads the files (blocking I/O); Unavailable naming the file when one cannot be read.
Result<std::string> weight_identity(const model::Checkpoint& checkpoint);

// The fingerprint of a run: build, --model (absolute path) and the weight identity, model config,
// --preset/--model-seed, prompts (flags and a hash of the token ids), sampling, batching, KV and --afd*
// settings. `requests` are the run's requests (make_requests).
Result<std::vector<afd::FingerprintItem>> run_fingerprint(const RunOptions& o, const model::Checkpoint& checkpoint,
                                                          const std::vector<engine::Request>& requests);

// The fingerprint of `genbridge serve --afd ... --afd-transport mpi` (every rank a serve process): build,
// --model / --preset / --model-seed, model config and weight identity, and the flags that shape the job
// (--max-batch, --kv-memory-mb, --kv-cache-dtype, --afd*). HTTP flags are this process's own.
Result<std::vector<afd::FingerprintItem>> serve_fingerprint(const RunOptions& o, const model::Checkpoint& checkpoint);

}  // namespace genbridge::tools
