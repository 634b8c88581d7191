# SoC selection (DESIGN §4): one selector -> (provider target, concrete SoC). The build knows targets,
# never operators.

set(GENBRIDGE_KNOWN_TARGETS Ascend910 Ascend950)
set(GENBRIDGE_ACCEPTED_SOC_SELECTORS
    "910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx")

# genbridge_normalize_soc(<selector> <out_target> <out_soc>)
function(genbridge_normalize_soc selector out_target out_soc)
  set(target "")
  set(soc "")
  if(selector STREQUAL "910B")
    set(target Ascend910)
    set(soc Ascend910B1)
  elseif(selector MATCHES "^Ascend910B[1-4]$")
    set(target Ascend910)
    set(soc ${selector})
  elseif(selector STREQUAL "910" OR selector STREQUAL "910C")
    set(target Ascend910)
    set(soc Ascend910_9382)
  elseif(selector MATCHES "^Ascend910_93[0-9][0-9]$")
    set(target Ascend910)
    set(soc ${selector})
  elseif(selector STREQUAL "950" OR selector STREQUAL "Ascend950")
    set(target Ascend950)
    set(soc Ascend950PR_9599)
  elseif(selector MATCHES "^Ascend950(PR|DT)_[0-9][0-9][0-9][0-9]$")
    set(target Ascend950)
    set(soc ${selector})
  else()
    message(FATAL_ERROR
      "genbridge: GENBRIDGE_SOC='${selector}' is not a known SoC selector; accepted selectors: "
      "${GENBRIDGE_ACCEPTED_SOC_SELECTORS}. Choose one with -DGENBRIDGE_SOC=... or a preset "
      "(cmake --preset ascend910 | ascend950).")
  endif()
  set(${out_target} ${target} PARENT_SCOPE)
  set(${out_soc} ${soc} PARENT_SCOPE)
endfunction()
