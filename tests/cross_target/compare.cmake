# Runs the peer target's gemma probe, then this build's probe against its output: both must pass the
# contract tolerance and the bf16 outputs must differ in at least one bit.
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND "${PEER}" "${WORK_DIR}/peer.bin" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "peer: ${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "peer probe ${PEER} failed (rc=${rc})")
endif()
execute_process(COMMAND "${SELF}" "${WORK_DIR}/self.bin" "${WORK_DIR}/peer.bin" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "self: ${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "probe ${SELF} failed (rc=${rc})")
endif()
