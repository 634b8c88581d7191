# SoC selection (docs/design.md#targets-and-soc-selectors): one selector -> (provider target, concrete SoC). The build knows targets,
# never operators.
#
# The selector table below is the only one: the runtime's (runtime/device/soc.cpp) is generated from it
# at configure time by genbridge_write_soc_table().

set(GENBRIDGE_KNOWN_TARGETS Ascend910 Ascend950)

# One row per selector family, three fields:
#   <regex the whole selector must match> <provider target> <concrete SoC, or * for the selector itself>
# The regexes use only the syntax CMake's MATCHES and ECMAScript std::regex read alike
# (^ $ [] () | ? * +; no {n} repetition, no \d, no ; or ").
set(GENBRIDGE_SOC_SELECTOR_TABLE
    "^910B$"                                  Ascend910 Ascend910B1
    "^Ascend910B[1-4]$"                       Ascend910 *
    "^(910|910C)$"                            Ascend910 Ascend910_9382
    "^Ascend910_93[0-9][0-9]$"                Ascend910 *
    "^(950|Ascend950)$"                       Ascend950 Ascend950PR_9599
    "^Ascend950(PR|DT)_[0-9][0-9][0-9][0-9]$" Ascend950 *)
# The same table in words, as error messages list it.
set(GENBRIDGE_ACCEPTED_SOC_SELECTORS
    "910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx")

# genbridge_normalize_soc(<selector> <out_target> <out_soc>)
# Fails the configure, listing the accepted selectors, when no row matches.
# _genbridge_soc_row(<i>): sets regex, target and soc to the fields of the row starting at index i of the table.
macro(_genbridge_soc_row i)
  math(EXPR _gb_j "${i} + 1")
  math(EXPR _gb_k "${i} + 2")
  list(GET GENBRIDGE_SOC_SELECTOR_TABLE ${i} regex)
  list(GET GENBRIDGE_SOC_SELECTOR_TABLE ${_gb_j} target)
  list(GET GENBRIDGE_SOC_SELECTOR_TABLE ${_gb_k} soc)
endmacro()

function(genbridge_normalize_soc selector out_target out_soc)
  list(LENGTH GENBRIDGE_SOC_SELECTOR_TABLE n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 3)
    _genbridge_soc_row(${i})
    if(selector MATCHES "${regex}")
      if(soc STREQUAL "*")
        set(soc "${selector}")
      endif()
      set(${out_target} ${target} PARENT_SCOPE)
      set(${out_soc} ${soc} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR
    "genbridge: GENBRIDGE_SOC='${selector}' is not a known SoC selector; accepted selectors: "
    "${GENBRIDGE_ACCEPTED_SOC_SELECTORS}. Choose one with -DGENBRIDGE_SOC=... or a preset "
    "(cmake --preset ascend910 | ascend950).")
endfunction()

# genbridge_write_soc_table(<header>)
# Writes the selector table as a C++ header (namespace genbridge::runtime::generated) for the runtime's
# selector parser; rewritten only when its content changes.
function(genbridge_write_soc_table header)
  list(LENGTH GENBRIDGE_SOC_SELECTOR_TABLE n)
  math(EXPR rem "${n} % 3")
  if(n EQUAL 0 OR NOT rem EQUAL 0)
    message(FATAL_ERROR "genbridge: GENBRIDGE_SOC_SELECTOR_TABLE has ${n} fields; rule: rows of three fields (regex, target, SoC)")
  endif()
  set(GENBRIDGE_SOC_SELECTOR_ROWS "")
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 3)
    _genbridge_soc_row(${i})
    if(NOT target IN_LIST GENBRIDGE_KNOWN_TARGETS)
      message(FATAL_ERROR "genbridge: selector row '${regex}' names target '${target}'; rule: one of ${GENBRIDGE_KNOWN_TARGETS}")
    endif()
    if(soc STREQUAL "*")
      set(soc "")
    endif()
    string(APPEND GENBRIDGE_SOC_SELECTOR_ROWS "    {R\"gb(${regex})gb\", \"${target}\", \"${soc}\"},\n")
  endforeach()
  configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/soc_selectors.h.in" "${header}" @ONLY)
endfunction()
