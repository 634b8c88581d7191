# Runs the peer target's gemma probe, then this build's probe against its output: both must pass the
# contract tolerance and the outputs must differ in at least one bit. MODE (optional): the probe's mode flag
# (--qwen35: a Qwen3.5 checkpoint's logits through the engine; --v4-kernels: DeepSeek-V4's kernels on bf16
# rows, and --v4-model: a DeepSeek-V4 checkpoint through the engine on bf16 rows, where the outputs must instead
# be bit-identical).
cmake_minimum_required(VERSION 3.25)
set(tag "${MODE}")
string(REPLACE "-" "" tag "${tag}")
execute_process(COMMAND "${PEER}" ${MODE} "${WORK_DIR}/peer${tag}.bin" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message(STATUS "peer: ${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "peer probe ${PEER} failed (rc=${rc})")
endif()
execute_process(COMMAND "${SELF}" ${MODE} "${WORK_DIR}/self${tag}.bin" "${WORK_DIR}/peer${tag}.bin" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "self: ${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "probe ${SELF} failed (rc=${rc})")
endif()
