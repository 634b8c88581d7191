# One case of build.staging.*: provider staging (cmake/GenbridgeProviders.cmake) on a fixture tree.
#   cmake -DCASE=<name> -DSOURCE_DIR=<repo root> -DWORK_DIR=<scratch dir> -P staging_case.cmake
# Writes a small valid tree (two stable modules, three headers, both targets) into WORK_DIR, breaks it the
# way the case says, runs genbridge_stage_providers() in a child `cmake -P` (a broken tree ends its
# process, as it ends a configure) and checks the exit status, every message and the error count.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/expect.cmake)

if(DEFINED CHILD_TARGET)
  include(${SOURCE_DIR}/cmake/GenbridgeProviders.cmake)
  genbridge_stage_providers(
    OPS_DIR "${WORK_DIR}/ops"
    HEADER_DIR "${WORK_DIR}/include/genbridge/ops"
    TARGET ${CHILD_TARGET}
    SOC FixtureSoc
    KNOWN_TARGETS Ascend910 Ascend950
    OUT_SOURCES sources
    OUT_REFERENCES references
    MANIFEST "${WORK_DIR}/manifest.json"
    OUT_MANIFEST_JSON json)
  message("staged sources: ${sources}")
  message("staged references: ${references}")
  message("manifest text: ${json}")
  return()
endif()

set(W "${WORK_DIR}")
set(H "${W}/include/genbridge/ops")
set(C "${W}/ops/common")
set(P "${W}/ops/target_providers")
file(REMOVE_RECURSE "${W}")

function(touch)
  foreach(f IN LISTS ARGN)
    file(WRITE "${f}" "// fixture\n")
  endforeach()
endfunction()

# The valid tree: alpha/op_shared in common/, alpha/op_split and beta/op_gen in each target tree.
touch("${H}/alpha/op_shared.h" "${H}/alpha/op_split.h" "${H}/beta/op_gen.h" "${C}/alpha/op_shared.cpp"
      "${P}/Ascend910/alpha/op_split.cpp" "${P}/Ascend910/beta/op_gen.cpp"
      "${P}/Ascend950/alpha/op_split.cpp" "${P}/Ascend950/beta/op_gen.cpp")

# stage(<target> <rc var> <output var>)
function(stage target rc_var out_var)
  gb_run(rc out ${CMAKE_COMMAND} -DSOURCE_DIR=${SOURCE_DIR} -DWORK_DIR=${W} -DCHILD_TARGET=${target}
         -P ${CMAKE_CURRENT_FUNCTION_LIST_FILE})
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# expect_errors(<count> <message>...): staging fails for either selected target with every message and
# exactly <count> errors: the whole tree is checked whichever target is selected.
function(expect_errors count)
  foreach(target Ascend910 Ascend950)
    stage(${target} rc out)
    gb_expect_failure("${CASE} (target ${target})" "${rc}" "${out}" ${ARGN}
                      "genbridge provider staging failed with ${count} error(s); see the messages above.")
  endforeach()
endfunction()

set(same_set "rule: all target trees expose the same module set")
set(no_header "rule: every implementation implements a stable header")
if(CASE STREQUAL "unknown_target")
  stage(Ascend960 rc out)
  gb_expect_failure("${CASE}" "${rc}" "${out}"
    "genbridge provider staging: ${P}/Ascend960: target 'Ascend960' is unknown; rule: the provider target must be one of Ascend910, Ascend950")
elseif(CASE STREQUAL "missing_target_dir")
  file(REMOVE_RECURSE "${P}/Ascend910")
  expect_errors(1 "genbridge provider staging: ${P}/Ascend910: directory does not exist; rule: every known target has a provider tree")
elseif(CASE STREQUAL "empty_tree")
  file(REMOVE_RECURSE "${P}/Ascend950")
  file(WRITE "${P}/Ascend950/alpha/README.md" "not a provider\n")
  expect_errors(1 "genbridge provider staging: ${P}/Ascend950: tree contains no provider files (*.cpp); rule: a provider tree must not be empty")
elseif(CASE STREQUAL "provider_also_in_common")
  touch("${C}/alpha/op_split.cpp")
  expect_errors(2
    "${P}/Ascend910/alpha/op_split.cpp: collides with ${C}/alpha/op_split.cpp; rule: a module is implemented either in common/ or in every target tree, never both"
    "${P}/Ascend950/alpha/op_split.cpp: collides with ${C}/alpha/op_split.cpp; rule: a module is implemented either in common/ or in every target tree, never both")
elseif(CASE STREQUAL "asymmetric_trees_extra_module")
  # Ascend950 has a module (with its header) that Ascend910 lacks: fails for both selections (selecting
  # Ascend910, the header also has no implementation).
  touch("${H}/beta/op_more.h" "${P}/Ascend950/beta/op_more.cpp")
  set(asymmetry "genbridge provider staging: ${P}/Ascend950/beta/op_more.cpp: no counterpart ${P}/Ascend910/beta/op_more.cpp; ${same_set}")
  stage(Ascend950 rc out)
  gb_expect_failure("${CASE} (target Ascend950)" "${rc}" "${out}" "${asymmetry}"
                    "genbridge provider staging failed with 1 error(s)")
  stage(Ascend910 rc out)
  gb_expect_failure("${CASE} (target Ascend910)" "${rc}" "${out}" "${asymmetry}"
    "genbridge provider staging: ${H}/beta/op_more.h: no implementation (expected ${C}/beta/op_more.cpp or ${P}/Ascend910/beta/op_more.cpp)"
    "genbridge provider staging failed with 2 error(s)")
elseif(CASE STREQUAL "asymmetric_unselected_tree")
  # Ascend910 lacks a module; building for Ascend950 (whose tree is complete) still fails.
  file(REMOVE "${P}/Ascend910/beta/op_gen.cpp")
  stage(Ascend950 rc out)
  gb_expect_failure("${CASE}" "${rc}" "${out}"
    "genbridge provider staging: ${P}/Ascend950/beta/op_gen.cpp: no counterpart ${P}/Ascend910/beta/op_gen.cpp; ${same_set}"
    "genbridge provider staging failed with 1 error(s)")
elseif(CASE STREQUAL "header_without_implementation")
  touch("${H}/beta/op_lonely.h")
  foreach(target Ascend910 Ascend950)
    stage(${target} rc out)
    gb_expect_failure("${CASE} (target ${target})" "${rc}" "${out}"
      "genbridge provider staging: ${H}/beta/op_lonely.h: no implementation (expected ${C}/beta/op_lonely.cpp or ${P}/${target}/beta/op_lonely.cpp); rule: every stable header has exactly one implementation"
      "genbridge provider staging failed with 1 error(s)")
  endforeach()
elseif(CASE STREQUAL "implementation_without_header_in_common")
  touch("${C}/alpha/op_orphan.cpp")
  expect_errors(1 "genbridge provider staging: ${C}/alpha/op_orphan.cpp: no stable header ${H}/alpha/op_orphan.h; ${no_header}")
elseif(CASE STREQUAL "implementation_without_header_in_target_tree")
  touch("${P}/Ascend910/beta/op_orphan.cpp" "${P}/Ascend950/beta/op_orphan.cpp")
  expect_errors(2 "genbridge provider staging: ${P}/Ascend910/beta/op_orphan.cpp: no stable header ${H}/beta/op_orphan.h; ${no_header}"
                  "genbridge provider staging: ${P}/Ascend950/beta/op_orphan.cpp: no stable header ${H}/beta/op_orphan.h; ${no_header}")
elseif(CASE STREQUAL "unknown_tree_directory")
  touch("${P}/Ascend960/alpha/op_split.cpp")
  expect_errors(1 "genbridge provider staging: ${P}/Ascend960: directory names no known target; rule: every provider tree is named after one of Ascend910, Ascend950")
elseif(CASE STREQUAL "valid_tree_stages_the_selected_target_only")
  foreach(target Ascend910 Ascend950)
    file(REMOVE "${W}/manifest.json")
    stage(${target} rc out)
    string(CONCAT json "{\n  \"target\": \"${target}\",\n  \"soc\": \"FixtureSoc\",\n  \"modules\": [\n"
             "    {\"module\": \"alpha/op_shared\", \"origin\": \"common\", \"implementation\": \"ops/common/alpha/op_shared.cpp\"},\n"
             "    {\"module\": \"alpha/op_split\", \"origin\": \"target\", \"implementation\": \"ops/target_providers/${target}/alpha/op_split.cpp\"},\n"
             "    {\"module\": \"beta/op_gen\", \"origin\": \"target\", \"implementation\": \"ops/target_providers/${target}/beta/op_gen.cpp\"}\n"
             "  ]\n}\n")
    gb_expect_success("${CASE} (target ${target})" "${rc}" "${out}"
      "staged sources: ${C}/alpha/op_shared.cpp;${P}/${target}/alpha/op_split.cpp;${P}/${target}/beta/op_gen.cpp\n"
      "manifest text: ${json}" "genbridge: staged 3 stable modules for ${target}")
    if(EXISTS "${W}/manifest.json")
      file(READ "${W}/manifest.json" written)
      if(NOT written STREQUAL json)
        gb_fail("${CASE} (target ${target}): manifest.json is\n${written}\nexpected\n${json}")
      endif()
    else()
      gb_fail("${CASE} (target ${target}): no manifest.json written")
    endif()
    # The other target's implementations are not staged (nor anything else under target_providers/).
    string(REGEX MATCH "staged sources: [^\n]*" staged "${out}")
    string(REPLACE "${P}/${target}/" "" rest "${staged}")
    if(rest MATCHES "target_providers")
      gb_fail("${CASE} (target ${target}): another tree's files staged: ${staged}")
    endif()
  endforeach()
elseif(CASE STREQUAL "private_kernels_staged_for_their_target_only")
  # A module folder holds its entries' kernels (a source beside its own header, or a target tree's source
  # implementing a common one) and fp64 references (*_ref.cpp). Kernels follow the entries: common ones in
  # every library, a target tree's in that target's alone; they are not modules (no stable header, no
  # counterpart in the other tree, not in the manifest). References are staged apart, never as sources.
  touch("${C}/alpha/shared_kernel.cpp" "${C}/alpha/shared_kernel.h" "${C}/alpha/alpha_ref.cpp"
        "${C}/alpha/alpha_ref.h" "${C}/alpha/reads.h" "${P}/Ascend950/beta/gen_kernel.cpp"
        "${P}/Ascend950/beta/gen_kernel.h" "${P}/Ascend950/alpha/split_kernel.cpp" "${P}/Ascend950/alpha/split_kernel.h"
        "${P}/Ascend910/alpha/reads.cpp" "${P}/Ascend950/alpha/reads.cpp")
  stage(Ascend950 rc out)
  gb_expect_success("${CASE} (target Ascend950)" "${rc}" "${out}"
    "staged sources: ${C}/alpha/op_shared.cpp;${P}/Ascend950/alpha/op_split.cpp;${P}/Ascend950/beta/op_gen.cpp;${C}/alpha/shared_kernel.cpp;${P}/Ascend950/alpha/reads.cpp;${P}/Ascend950/alpha/split_kernel.cpp;${P}/Ascend950/beta/gen_kernel.cpp\n"
    "staged references: ${C}/alpha/alpha_ref.cpp\n"
    "genbridge: staged 3 stable modules for Ascend950" "genbridge: staged 3 private kernel sources for Ascend950")
  if(out MATCHES "\"module\": \"[a-z]+/(shared_kernel|gen_kernel|split_kernel|reads|alpha_ref)")
    gb_fail("${CASE}: a kernel or reference is listed as a module:\n${out}")
  endif()
  stage(Ascend910 rc out)
  gb_expect_success("${CASE} (target Ascend910)" "${rc}" "${out}"
    "staged sources: ${C}/alpha/op_shared.cpp;${P}/Ascend910/alpha/op_split.cpp;${P}/Ascend910/beta/op_gen.cpp;${C}/alpha/shared_kernel.cpp;${P}/Ascend910/alpha/reads.cpp\n"
    "genbridge: staged 3 stable modules for Ascend910" "genbridge: staged 1 private kernel sources for Ascend910")
  if(out MATCHES "Ascend950")
    gb_fail("${CASE} (target Ascend910): another target's kernels staged:\n${out}")
  endif()
else()
  message(FATAL_ERROR "staging_case.cmake: unknown CASE '${CASE}'")
endif()
gb_finish()
