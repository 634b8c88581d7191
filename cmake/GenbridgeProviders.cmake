# Provider staging (docs/design.md#provider-staging): the directory tree is the registry. The relative path of a provider
# entry under ops/common/ or ops/target_providers/<Target>/ is the key of the stable contract it
# implements (include/genbridge/ops/<key>.h). This file knows targets, never operator names.
# A module folder (ops/common/<module>/, ops/target_providers/<Target>/<module>/) also holds what its entries
# run, told apart by name:
#   <name>_ref.cpp  an fp64 reference (test oracle; ops/common/ only): OUT_REFERENCES, never the library;
#   <name>.cpp beside its own <name>.h, or (in a target tree) beside nothing but implementing
#                   ops/common/<module>/<name>.h: a kernel or helper, not a module. Common ones are compiled
#                   into every library, a target tree's into that target's library only;
#   any other <name>.cpp: the provider entry of the module <module>/<name>.
#
# genbridge_stage_providers(
#   OPS_DIR <dir>            holds common/ and target_providers/<Target>/
#   HEADER_DIR <dir>         holds the stable headers <module>/<op>.h
#   TARGET <target>          the selected provider target
#   SOC <soc>                the concrete SoC (recorded in the manifest)
#   KNOWN_TARGETS <t>...     every target; all trees are checked on every configure
#   OUT_SOURCES <var>        receives the library's files for the selected target (entries, then kernels)
#   OUT_REFERENCES <var>     (optional) receives the fp64 references (ops/common/**/*_ref.cpp)
#   MANIFEST <file>          JSON listing every stable module and where its implementation came from
#   OUT_MANIFEST_JSON <var>  (optional) receives the manifest text)
# Every broken rule is reported with the path and the rule; any error fails the configure.

# Globs re-run at build time when files appear or vanish (not available, nor needed, in script mode, where
# the build.staging.* tests call genbridge_stage_providers() on fixture trees).
if(CMAKE_SCRIPT_MODE_FILE)
  set(_GB_GLOB_DEPENDS "")
else()
  set(_GB_GLOB_DEPENDS CONFIGURE_DEPENDS)
endif()

function(_gb_stage_error msg)
  message(SEND_ERROR "genbridge provider staging: ${msg}")
  # A count, not a list of the messages: every message holds a ';' ("...; rule: ...").
  get_property(n GLOBAL PROPERTY _GB_STAGE_ERRORS)
  math(EXPR n "${n} + 1")
  set_property(GLOBAL PROPERTY _GB_STAGE_ERRORS ${n})
endfunction()

# Sorts the *.cpp files under `dir` (a common or target tree; `common_dir` for a target tree's kernels that
# implement a common header) into module keys ("<module>/<op>"), kernel sources and reference sources.
function(_gb_tree_files dir common_dir out_keys out_kernels out_refs)
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${dir}" ${_GB_GLOB_DEPENDS} "${dir}/*.cpp")
  list(SORT files)
  set(keys "")
  set(kernels "")
  set(refs "")
  foreach(f IN LISTS files)
    string(REGEX REPLACE "\\.cpp$" "" k "${f}")
    if(k MATCHES "_ref$")
      list(APPEND refs "${dir}/${f}")
    elseif(EXISTS "${dir}/${k}.h" OR (common_dir AND EXISTS "${common_dir}/${k}.h"))
      list(APPEND kernels "${dir}/${f}")
    else()
      list(APPEND keys "${k}")
    endif()
  endforeach()
  list(SORT keys)
  set(${out_keys} "${keys}" PARENT_SCOPE)
  set(${out_kernels} "${kernels}" PARENT_SCOPE)
  set(${out_refs} "${refs}" PARENT_SCOPE)
endfunction()

function(genbridge_stage_providers)
  cmake_parse_arguments(PARSE_ARGV 0 S "" "OPS_DIR;HEADER_DIR;TARGET;SOC;OUT_SOURCES;OUT_REFERENCES;MANIFEST;OUT_MANIFEST_JSON"
                        "KNOWN_TARGETS")
  set_property(GLOBAL PROPERTY _GB_STAGE_ERRORS 0)
  set(common_dir "${S_OPS_DIR}/common")
  set(providers_dir "${S_OPS_DIR}/target_providers")

  # Rule: the selected target must be known.
  list(JOIN S_KNOWN_TARGETS ", " known_text)
  if(NOT S_TARGET IN_LIST S_KNOWN_TARGETS)
    message(FATAL_ERROR "genbridge provider staging: ${providers_dir}/${S_TARGET}: target '${S_TARGET}' is unknown; "
                        "rule: the provider target must be one of ${known_text}")
  endif()

  # Rule: every directory under target_providers/ names a known target.
  file(GLOB tree_dirs LIST_DIRECTORIES true RELATIVE "${providers_dir}" "${providers_dir}/*")
  foreach(d IN LISTS tree_dirs)
    if(IS_DIRECTORY "${providers_dir}/${d}" AND NOT d IN_LIST S_KNOWN_TARGETS)
      _gb_stage_error("${providers_dir}/${d}: directory names no known target; rule: every provider tree is named after one of ${known_text}")
    endif()
  endforeach()

  # Rules checked for every known target, not only the selected one: the tree exists and is non-empty.
  set(reference_target "")
  foreach(t IN LISTS S_KNOWN_TARGETS)
    set(tdir "${providers_dir}/${t}")
    if(NOT IS_DIRECTORY "${tdir}")
      _gb_stage_error("${tdir}: directory does not exist; rule: every known target has a provider tree")
      continue()
    endif()
    _gb_tree_files("${tdir}" "${common_dir}" keys kernels refs)
    foreach(r IN LISTS refs)
      _gb_stage_error("${r}: an fp64 reference in a target tree; rule: references are target-independent and live in ${common_dir}/")
    endforeach()
    if(NOT keys)
      _gb_stage_error("${tdir}: tree contains no provider files (*.cpp); rule: a provider tree must not be empty")
      continue()
    endif()
    set(keys_${t} "${keys}")
    set(kernels_${t} "${kernels}")
    if(NOT reference_target)
      set(reference_target ${t})
    endif()
  endforeach()

  # Rule: all target trees expose the same module set.
  foreach(t IN LISTS S_KNOWN_TARGETS)
    if(NOT DEFINED keys_${t} OR t STREQUAL reference_target)
      continue()
    endif()
    foreach(k IN LISTS keys_${t})
      if(NOT k IN_LIST keys_${reference_target})
        _gb_stage_error("${providers_dir}/${t}/${k}.cpp: no counterpart ${providers_dir}/${reference_target}/${k}.cpp; rule: all target trees expose the same module set")
      endif()
    endforeach()
    foreach(k IN LISTS keys_${reference_target})
      if(NOT k IN_LIST keys_${t})
        _gb_stage_error("${providers_dir}/${reference_target}/${k}.cpp: no counterpart ${providers_dir}/${t}/${k}.cpp; rule: all target trees expose the same module set")
      endif()
    endforeach()
  endforeach()

  # Rule: a module lives in common or in the target trees, never both.
  _gb_tree_files("${common_dir}" "" common_keys common_kernels common_refs)
  foreach(t IN LISTS S_KNOWN_TARGETS)
    foreach(k IN LISTS keys_${t})
      if(k IN_LIST common_keys)
        _gb_stage_error("${providers_dir}/${t}/${k}.cpp: collides with ${common_dir}/${k}.cpp; rule: a module is implemented either in common/ or in every target tree, never both")
      endif()
    endforeach()
  endforeach()

  # Rules: every stable header has exactly one implementation; every implementation has a header.
  file(GLOB_RECURSE headers LIST_DIRECTORIES false RELATIVE "${S_HEADER_DIR}" ${_GB_GLOB_DEPENDS} "${S_HEADER_DIR}/*.h")
  set(header_keys "")
  foreach(h IN LISTS headers)
    string(REGEX REPLACE "\\.h$" "" k "${h}")
    list(APPEND header_keys "${k}")
  endforeach()
  list(SORT header_keys)
  if(NOT header_keys)
    _gb_stage_error("${S_HEADER_DIR}: no stable operator headers; rule: the library exposes at least one stable contract")
  endif()
  foreach(k IN LISTS common_keys)
    if(NOT k IN_LIST header_keys)
      _gb_stage_error("${common_dir}/${k}.cpp: no stable header ${S_HEADER_DIR}/${k}.h; rule: every implementation implements a stable header")
    endif()
  endforeach()
  foreach(t IN LISTS S_KNOWN_TARGETS)
    foreach(k IN LISTS keys_${t})
      if(NOT k IN_LIST header_keys)
        _gb_stage_error("${providers_dir}/${t}/${k}.cpp: no stable header ${S_HEADER_DIR}/${k}.h; rule: every implementation implements a stable header")
      endif()
    endforeach()
  endforeach()

  set(sources "")
  set(entries "")
  foreach(k IN LISTS header_keys)
    set(in_common FALSE)
    set(in_target FALSE)
    if(k IN_LIST common_keys)
      set(in_common TRUE)
    endif()
    if(DEFINED keys_${S_TARGET} AND k IN_LIST keys_${S_TARGET})
      set(in_target TRUE)
    endif()
    if(NOT in_common AND NOT in_target)
      # A missing or empty selected tree is reported once above, not once per header.
      if(DEFINED keys_${S_TARGET})
        _gb_stage_error("${S_HEADER_DIR}/${k}.h: no implementation (expected ${common_dir}/${k}.cpp or ${providers_dir}/${S_TARGET}/${k}.cpp); rule: every stable header has exactly one implementation")
      endif()
    elseif(in_common AND in_target)
      # Already reported as a collision; recorded here for the manifest rule's sake.
    elseif(in_common)
      list(APPEND sources "${common_dir}/${k}.cpp")
      list(APPEND entries "    {\"module\": \"${k}\", \"origin\": \"common\", \"implementation\": \"ops/common/${k}.cpp\"}")
    else()
      list(APPEND sources "${providers_dir}/${S_TARGET}/${k}.cpp")
      list(APPEND entries "    {\"module\": \"${k}\", \"origin\": \"target\", \"implementation\": \"ops/target_providers/${S_TARGET}/${k}.cpp\"}")
    endif()
  endforeach()

  # Kernels after the entries: the common ones, then the selected target's own.
  set(private_kernels ${kernels_${S_TARGET}})
  list(LENGTH private_kernels num_private)

  get_property(num_errors GLOBAL PROPERTY _GB_STAGE_ERRORS)
  if(num_errors GREATER 0)
    message(FATAL_ERROR "genbridge provider staging failed with ${num_errors} error(s); see the messages above.")
  endif()

  list(JOIN entries ",\n" entries_text)
  set(json "{\n  \"target\": \"${S_TARGET}\",\n  \"soc\": \"${S_SOC}\",\n  \"modules\": [\n${entries_text}\n  ]\n}\n")
  if(S_MANIFEST)
    file(WRITE "${S_MANIFEST}" "${json}")
  endif()
  if(S_OUT_MANIFEST_JSON)
    set(${S_OUT_MANIFEST_JSON} "${json}" PARENT_SCOPE)
  endif()
  list(LENGTH sources num_sources)
  message(STATUS "genbridge: staged ${num_sources} stable modules for ${S_TARGET}")
  if(num_private GREATER 0)
    message(STATUS "genbridge: staged ${num_private} private kernel sources for ${S_TARGET}")
  endif()
  list(APPEND sources ${common_kernels} ${private_kernels})
  set(${S_OUT_SOURCES} "${sources}" PARENT_SCOPE)
  if(S_OUT_REFERENCES)
    set(${S_OUT_REFERENCES} "${common_refs}" PARENT_SCOPE)
  endif()
endfunction()
