# One case of build.soc.*: configure-time SoC normalisation (cmake/GenbridgeSoc.cmake) in script mode.
#   cmake -DCASE=<name> -DSOURCE_DIR=<repo root> -P soc_case.cmake
# Each selector of the case runs genbridge_normalize_soc() in a child `cmake -P` (a failing selector ends
# its process, as it ends a configure); the expectations are the table of docs/design.md#targets-and-soc-selectors, written out here.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/expect.cmake)

if(DEFINED CHILD_SELECTOR)
  include(${SOURCE_DIR}/cmake/GenbridgeSoc.cmake)
  genbridge_normalize_soc("${CHILD_SELECTOR}" target soc)
  message("normalized: target=${target} soc=${soc}")
else()
  # Rows: "<selector>><provider target>><concrete SoC>" or "<selector>>error".
  if(CASE STREQUAL "910B_is_Ascend910B1")
    set(rows "910B>Ascend910>Ascend910B1")
  elseif(CASE STREQUAL "Ascend910B1_to_B4_are_kept")
    set(rows "Ascend910B1>Ascend910>Ascend910B1" "Ascend910B2>Ascend910>Ascend910B2"
             "Ascend910B3>Ascend910>Ascend910B3" "Ascend910B4>Ascend910>Ascend910B4")
  elseif(CASE STREQUAL "910_is_Ascend910_9382")
    set(rows "910>Ascend910>Ascend910_9382")
  elseif(CASE STREQUAL "910C_is_Ascend910_9382")
    set(rows "910C>Ascend910>Ascend910_9382")
  elseif(CASE STREQUAL "Ascend910_9382_is_kept")
    set(rows "Ascend910_9382>Ascend910>Ascend910_9382")
  elseif(CASE STREQUAL "Ascend910_93xx_are_kept")
    set(rows "Ascend910_9392>Ascend910>Ascend910_9392" "Ascend910_9362>Ascend910>Ascend910_9362")
  elseif(CASE STREQUAL "950_is_Ascend950PR_9599")
    set(rows "950>Ascend950>Ascend950PR_9599")
  elseif(CASE STREQUAL "Ascend950_is_Ascend950PR_9599")
    set(rows "Ascend950>Ascend950>Ascend950PR_9599")
  elseif(CASE STREQUAL "Ascend950PR_xxxx_is_kept")
    set(rows "Ascend950PR_9599>Ascend950>Ascend950PR_9599" "Ascend950PR_1234>Ascend950>Ascend950PR_1234")
  elseif(CASE STREQUAL "Ascend950DT_xxxx_is_kept")
    set(rows "Ascend950DT_9591>Ascend950>Ascend950DT_9591")
  elseif(CASE STREQUAL "unknown_selector_lists_the_accepted_ones")
    # Near misses of every family, other spellings and the empty selector.
    set(rows "foo>error" ">error" "910b>error" "Ascend910B>error" "Ascend910B5>error" "Ascend910B12>error"
             "Ascend910_9482>error" "Ascend910_938>error" "Ascend910_93822>error" "Ascend950PR_99>error"
             "Ascend950XX_1234>error" "Ascend950PR_95990>error" "A5>error" "960>error" "9100>error")
  else()
    message(FATAL_ERROR "soc_case.cmake: unknown CASE '${CASE}'")
  endif()

  set(accepted "910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx")
  set(failures 0)
  foreach(row IN LISTS rows)
    string(REPLACE ">" ";" fields "${row}")
    list(GET fields 0 selector)
    list(GET fields 1 want_target)
    gb_run(rc out ${CMAKE_COMMAND} -DSOURCE_DIR=${SOURCE_DIR} "-DCHILD_SELECTOR=${selector}" -P ${CMAKE_CURRENT_LIST_FILE})
    if(want_target STREQUAL "error")
      gb_expect_failure("selector '${selector}'" "${rc}" "${out}"
        "genbridge: GENBRIDGE_SOC='${selector}' is not a known SoC selector; accepted selectors: ${accepted}. Choose one with -DGENBRIDGE_SOC=... or a preset (cmake --preset ascend910 | ascend950).")
    else()
      list(GET fields 2 want_soc)
      gb_expect_success("selector '${selector}'" "${rc}" "${out}" "normalized: target=${want_target} soc=${want_soc}\n")
    endif()
  endforeach()
  gb_finish()
endif()
