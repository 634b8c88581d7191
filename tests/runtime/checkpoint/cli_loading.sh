#!/usr/bin/env bash
# CLI checks of the loader flags, as a user runs them.
#   no_mmap GENBRIDGE WORK          --no-mmap prints the same results and dumps byte-identical logits as a
#                                   mapped run (monolithic and in-process AFD)
#   check_weights GENBRIDGE WRITER WORK   --check-weights passes a clean model printing the scan's cost, and
#                                   refuses one with +Inf in lm_head naming the tensor, index and value
#   fifo GENBRIDGE WORK             a FIFO named config.json / model.safetensors is refused at once (it used
#                                   to block open() forever)
#   dsv4 GENBRIDGE WORK             make-model --preset tiny-dsv4 writes a tokenizer beside the checkpoint; run
#                                   loads it (the log says once that the MTP layer's 53 tensors are ignored) and
#                                   decodes 3 prompts of 140 tokens; --afd 1A1F and 2A1F give the same tokens
#                                   and logits bytes; make-model --weight-quant fp8 (DeepSeek's FP8 + MXFP4
#                                   form) runs too (the log names the form, and the MTP layer's 85 tensors, its
#                                   32 scales included)
#   dsv4_weight_quant GENBRIDGE WORK
#                                   make-model --weight-quant fp8 --preset tiny-dsv4 (DeepSeek's FP8 + MXFP4 form),
#                                   then run: --weight-quant none says the 34 FP8 and 96 MXFP4 weights run as their
#                                   exact bf16 dequantization; auto on a build whose generation runs MX keeps every
#                                   value (MXFP8 with the file's e4m3 codes, the experts' own MXFP4 codes) and gives
#                                   none's logits bit for bit, elsewhere converts everything to w8a8 saying the
#                                   bytes and the measured error; w8a8 likewise on every build; --afd 2A1F gives
#                                   the monolithic run's logits
#   fp8_deepseek GENBRIDGE WORK     make-model --weight-quant fp8 on tiny-dsv3 / tiny-dsa writes every MLA,
#                                   indexer wq_b/wk and MLP / expert projection as F8_E4M3; run --weight-quant
#                                   auto converts all 141 quantized matrices (shared experts included) from
#                                   the FP8 blocks, and --afd 2A1F gives the same results
set -u
case=$1 genbridge=$2
shift 2
fail() { echo "FAIL: $*"; exit 1; }

case $case in
no_mmap)
  work=$1
  rm -rf "$work" && mkdir -p "$work" || exit 1
  "$genbridge" make-model --preset tiny --seed 3 "$work/m" > /dev/null 2>&1 || fail "make-model failed"
  common=(--model "$work/m" --num-prompts 3 --prompt-len 9 --max-new-tokens 6 --quiet)
  for mode in mmap no_mmap afd_no_mmap; do
    extra=()
    [ $mode != mmap ] && extra+=(--no-mmap)
    [ $mode = afd_no_mmap ] && extra+=(--afd 2A1F)
    "$genbridge" run "${common[@]}" "${extra[@]}" --dump-logits "$work/$mode.npy" > "$work/$mode.txt" 2> "$work/$mode.err" ||
      { cat "$work/$mode.err"; fail "genbridge run ($mode) failed"; }
    grep '^request ' "$work/$mode.txt" > "$work/$mode.results"
  done
  [ "$(wc -l < "$work/mmap.results")" = 3 ] || fail "expected 3 result lines"
  for mode in no_mmap afd_no_mmap; do
    diff "$work/mmap.results" "$work/$mode.results" || fail "$mode results differ from the mapped run"
    cmp "$work/mmap.npy" "$work/$mode.npy" || fail "$mode logits differ from the mapped run"
  done
  echo "PASS: --no-mmap results and logits identical (monolithic and --afd 2A1F)"
  ;;
check_weights)
  writer=$1 work=$2
  rm -rf "$work" && mkdir -p "$work" || exit 1
  "$genbridge" make-model --preset tiny --seed 1 "$work/clean" > /dev/null 2>&1 || fail "make-model failed"
  "$writer" "$work/inf" || fail "write_nonfinite_checkpoint failed"
  "$genbridge" run --model "$work/clean" --prompt 1,2,3 --max-new-tokens 2 --quiet --check-weights \
    > "$work/clean.out" 2> "$work/clean.err" || { cat "$work/clean.err"; fail "the clean model was refused"; }
  cat "$work/clean.err"
  grep -Eq '^check-weights: 125 tensors, 2\.6 MiB scanned in [0-9.e+-]+ s \([0-9.]+ GB/s\): all finite$' \
    "$work/clean.err" || fail "no scan cost line for the clean model"
  "$genbridge" run --model "$work/inf" --prompt 1,2,3 --max-new-tokens 2 --quiet --check-weights \
    > "$work/inf.out" 2> "$work/inf.err"
  rc=$?
  cat "$work/inf.err"
  [ $rc = 1 ] || fail "exit code $rc for a model with +Inf (expected 1)"
  want="genbridge run: InvalidArgument: $work/inf/model.safetensors: tensor 'lm_head.weight' holds +Inf at flat index 60000 (index [468, 96] of shape [512, 128]); every weight must be finite"
  grep -Fxq "$want" "$work/inf.err" || fail "expected the line: $want"
  grep -q '^request ' "$work/inf.out" && fail "results were printed for a refused model"
  echo "PASS: --check-weights"
  ;;
fifo)
  work=$1
  rm -rf "$work" && mkdir -p "$work" || exit 1
  "$genbridge" make-model --preset tiny --seed 1 "$work/m" > /dev/null 2>&1 || fail "make-model failed"
  for f in config.json model.safetensors; do
    mv "$work/m/$f" "$work/$f.saved" && mkfifo "$work/m/$f" || exit 1
    timeout -k 2 10 "$genbridge" run --model "$work/m" --prompt 1 --max-new-tokens 1 --quiet > /dev/null 2> "$work/err"
    rc=$?
    cat "$work/err"
    [ $rc = 124 ] && fail "genbridge run blocked on a FIFO named $f"
    [ $rc = 1 ] || fail "exit code $rc (expected 1)"
    grep -Fxq "genbridge run: InvalidArgument: $work/m/$f: is a FIFO (named pipe), not a regular file" "$work/err" ||
      fail "no message naming the FIFO $f"
    rm "$work/m/$f" && mv "$work/$f.saved" "$work/m/$f"
  done
  echo "PASS: FIFOs refused without blocking"
  ;;
fp8_deepseek)
  work=$1
  rm -rf "$work" && mkdir -p "$work" || exit 1
  for preset in tiny-dsv3 tiny-dsa; do
    m="$work/$preset"
    "$genbridge" make-model --preset $preset --seed 2 --weight-quant fp8 "$m" > /dev/null 2>&1 ||
      fail "make-model --preset $preset --weight-quant fp8 failed"
    for mode in mono afd; do
      extra=()
      [ $mode = afd ] && extra+=(--afd 2A1F)
      "$genbridge" run --model "$m" --prompt 1,2,3,4,5 --max-new-tokens 4 --weight-quant auto "${extra[@]}" \
        > "$work/$preset.$mode.out" 2> "$work/$preset.$mode.err" ||
        { cat "$work/$preset.$mode.err"; fail "genbridge run $preset ($mode) failed"; }
      grep '^request ' "$work/$preset.$mode.out" > "$work/$preset.$mode.results"
    done
    # 3 layers (the first dense), 4 heads, q_lora, 16 experts, a shared expert: 36 attention (4 + 2 x 4 per
    # layer), 96 routed, 6 shared-expert and 3 dense-MLP matrices, each from its FP8 blocks.
    line=$(grep '^weights: ' "$work/$preset.mono.err")
    echo "$preset: $line"
    echo "$line" | grep -Eq ' \(141 matrices, 141 of them from the checkpoint.s FP8 blocks directly: ' ||
      fail "$preset: expected 141 matrices, all from the FP8 blocks"
    [ -s "$work/$preset.mono.results" ] || fail "$preset: no result lines"
    diff "$work/$preset.mono.results" "$work/$preset.afd.results" || fail "$preset: --afd 2A1F results differ"
  done
  echo "PASS: DeepSeek FP8 checkpoints convert every quantized matrix from FP8"
  ;;
dsv4_weight_quant)
  work=$1
  rm -rf "$work" && mkdir -p "$work" || exit 1
  "$genbridge" make-model --preset tiny-dsv4 --seed 1 --weight-quant fp8 "$work/fp8" > /dev/null 2>&1 ||
    fail "make-model --weight-quant fp8 failed"
  # Prompts past a ratio-128 window; 4 layers, 2 output groups, 8 experts, a shared expert: 36 FP8 matrices
  # (wq_a, wq_b, wkv, wo_a x 2 groups, wo_b, shared w1 / w3 / w2 per layer), 96 MXFP4 expert matrices.
  common=(--model "$work/fp8" --num-prompts 2 --prompt-len 140 --max-new-tokens 6)
  for mode in none auto w8a8 auto_afd; do
    extra=(--weight-quant "${mode%_afd}")
    [ $mode = auto_afd ] && extra+=(--afd 2A1F)
    timeout -k 2 100 "$genbridge" run "${common[@]}" "${extra[@]}" --dump-logits "$work/$mode.npy" \
      > "$work/$mode.out" 2> "$work/$mode.err" || { cat "$work/$mode.err"; fail "$mode: genbridge run failed"; }
    [ "$(grep -c '^request ' "$work/$mode.out")" = 2 ] || fail "$mode: expected 2 result lines"
    echo "$mode: $(grep '^weights: ' "$work/$mode.err")"
    [ "$(grep -c '^weights: ' "$work/$mode.err")" = 1 ] || fail "$mode: expected one weights line"
  done
  grep -Eq '^weights: bf16 \(weight_quant=none\), [0-9.]+ MiB; the checkpoint.s 34 FP8 and 96 MXFP4 weights \([0-9.]+ MiB in the file\) run as their bf16 dequantization \([0-9.]+ MiB\), exact$' \
    "$work/none.err" || fail "none: the weights line does not say the FP8 + MXFP4 weights run as their exact bf16 dequantization"
  w8a8_line='the checkpoint.s FP8 blocks \(36 matrices, [0-9.]+ MiB in the file\) -> w8a8, [0-9.]+ MiB: 36 requantized from the decoded values \(relative RMS error [0-9.e+-]+%\); the checkpoint.s MXFP4 blocks \(96 matrices, [0-9.]+ MiB in the file\) -> w8a8, [0-9.]+ MiB: 96 requantized from the decoded values \(relative RMS error [0-9.e+-]+%\)'
  grep -Eq "^weights: w8a8 for attention projections and experts \(132 matrices, 36 of them .*; $w8a8_line" "$work/w8a8.err" ||
    fail "w8a8: the weights line does not say what the FP8 and MXFP4 weights became"
  cmp -s "$work/none.npy" "$work/w8a8.npy" && fail "w8a8 gave the bf16 dequantization's logits"
  if grep -q '| weights (weight_quant=auto): mxfp8 ' "$work/auto.err"; then
    # A generation with an MX data path: every value the file holds, kept.
    grep -Fq "; a checkpoint's MXFP4 weights: mxfp4, their own codes" "$work/auto.err" || fail "auto: the device line does not say the MXFP4 weights keep their codes"
    grep -Eq "^weights: mxfp8 for attention projections and shared experts, mxfp4 for routed experts \(132 matrices, .*; the checkpoint.s FP8 blocks \(36 matrices, [0-9.]+ MiB in the file\) -> mxfp8, [0-9.]+ MiB: 36 exactly \(the file.s e4m3 codes, each block.s scale repeated per 32 along K\); the checkpoint.s MXFP4 blocks \(96 matrices, [0-9.]+ MiB in the file\) -> mxfp4, [0-9.]+ MiB: 96 exactly \(the file.s codes, read in place, and scales\);" \
      "$work/auto.err" || fail "auto: the weights line does not say every FP8 and MXFP4 weight was kept"
    # Every value kept, reduced in another order (the MX kernels' fp32 order, bf16 weights' pair order;
    # docs/linear.md): the logits stay within rounding of the bf16 dequantization's.
    python3 - "$work/none.npy" "$work/auto.npy" <<'PY' || fail "auto kept every value but its logits moved away from the bf16 dequantization's"
import math, struct, sys
def floats(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    assert b"'<f4'" in b[10:10 + n], "expected little-endian float32"
    data = b[10 + n:]
    return struct.unpack("<%df" % (len(data) // 4), data)
a, b = floats(sys.argv[1]), floats(sys.argv[2])
assert len(a) == len(b), (len(a), len(b))
rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / max(sum(x * x for x in a), 1e-30))
print(f"auto vs bf16 dequantization: relative L2 {rel:.3g}")
sys.exit(0 if rel <= 0.1 else 1)
PY
  else
    grep -Eq "^weights: w8a8 for attention projections and experts \(132 matrices, .*; $w8a8_line" "$work/auto.err" ||
      fail "auto: the weights line does not say the FP8 and MXFP4 weights were converted to w8a8"
    cmp "$work/w8a8.npy" "$work/auto.npy" || fail "auto (w8a8 here) differs from --weight-quant w8a8"
  fi
  cmp "$work/auto.npy" "$work/auto_afd.npy" || fail "--afd 2A1F logits differ from the monolithic run's"
  echo "PASS: DeepSeek-V4's FP8 + MXFP4 form under --weight-quant none, auto, w8a8 and --afd 2A1F"
  ;;
dsv4)
  work=$1
  rm -rf "$work" && mkdir -p "$work" || exit 1
  "$genbridge" make-model --preset tiny-dsv4 --seed 1 "$work/m" > /dev/null 2>&1 || fail "make-model failed"
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    [ -s "$work/m/$f" ] || fail "make-model --preset tiny-dsv4 wrote no $f"
  done
  # Prompts past a ratio-128 window and many ratio-4 windows; monolithic and AFD give the same tokens and logits.
  common=(--model "$work/m" --num-prompts 3 --prompt-len 140 --max-new-tokens 8)
  for mode in mono afd1 afd2; do
    extra=()
    [ $mode = afd1 ] && extra+=(--afd 1A1F)
    [ $mode = afd2 ] && extra+=(--afd 2A1F)
    timeout -k 2 100 "$genbridge" run "${common[@]}" "${extra[@]}" --dump-logits "$work/$mode.npy" \
      > "$work/$mode.out" 2> "$work/$mode.err" || { cat "$work/$mode.err"; fail "$mode: genbridge run failed"; }
    grep '^request ' "$work/$mode.out" > "$work/$mode.results"
  done
  [ "$(wc -l < "$work/mono.results")" = 3 ] || fail "expected 3 result lines"
  for mode in afd1 afd2; do
    diff "$work/mono.results" "$work/$mode.results" || fail "$mode results differ from the monolithic run"
    cmp "$work/mono.npy" "$work/$mode.npy" || fail "$mode logits differ from the monolithic run"
  done
  ignored="model $work/m: 53 tensors of the multi-token prediction layers (mtp.*) ignored: genbridge does not run them"
  [ "$(grep -Fxc "$ignored" "$work/mono.err")" = 1 ] || fail "expected the line once: $ignored"
  # DeepSeek's FP8 + MXFP4 form: loads (dequantized to bf16, exactly) and runs.
  "$genbridge" make-model --preset tiny-dsv4 --seed 1 --weight-quant fp8 "$work/fp8" > /dev/null 2>&1 ||
    fail "make-model --weight-quant fp8 failed"
  timeout -k 2 100 "$genbridge" run --model "$work/fp8" --num-prompts 3 --prompt-len 140 --max-new-tokens 8 \
    > "$work/fp8.out" 2> "$work/fp8.err" || { cat "$work/fp8.err"; fail "fp8: genbridge run failed"; }
  [ "$(grep -c '^request ' "$work/fp8.out")" = 3 ] || fail "fp8: expected 3 result lines"
  grep -Fq "; FP8 linears, MXFP4 routed experts (dequantized to bf16 at load)" "$work/fp8.err" ||
    fail "fp8: the log does not name the FP8 + MXFP4 form"
  ignored="model $work/fp8: 85 tensors of the multi-token prediction layers (mtp.*) ignored: genbridge does not run them"
  [ "$(grep -Fxc "$ignored" "$work/fp8.err")" = 1 ] || fail "expected the line once: $ignored"
  echo "PASS: tiny-dsv4 runs; --afd 1A1F and 2A1F give the monolithic run's tokens and logits; the FP8 + MXFP4 form runs"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
