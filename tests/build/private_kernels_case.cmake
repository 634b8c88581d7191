# build.private_kernels_only_in_their_target: the kernels in ops/target_providers/<Target>/<module>/ (those only
# one generation uses, declared in headers beside them) are compiled into that target's library and no other (docs/design.md#provider-staging, README "Adding an
# operator"). Reads the functions each target's private headers declare, then the library's symbols (nm):
#   cmake -DSOURCE_DIR=<repo root> -DTARGET=<this build's provider target> -DLIBRARY=<libgenbridge_ops_*.a>
#         -DNM=<nm> -P private_kernels_case.cmake
# Every function of this target's private headers must be defined in the library; no function of another
# target's private headers may appear in it at all (defined or referenced).
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/expect.cmake)

# Out-of-line functions declared at namespace scope in <dir>/**.h: a line starting with a return type and
# the name (inline functions and templates are not library symbols and are skipped).
function(declared_functions dir out)
  file(GLOB_RECURSE headers LIST_DIRECTORIES false "${dir}/*.h")
  set(names "")
  foreach(h IN LISTS headers)
    file(STRINGS "${h}" lines REGEX "^[A-Za-z][A-Za-z0-9_:<>]*[ *&]+[a-z_][a-z0-9_]*\\(")
    foreach(l IN LISTS lines)
      if(l MATCHES "^(inline|template|constexpr|static|return|using|typedef) ")
        continue()
      endif()
      string(REGEX MATCH "([a-z_][a-z0-9_]*)\\(" m "${l}")
      list(APPEND names "${CMAKE_MATCH_1}")
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES names)
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

execute_process(COMMAND "${NM}" -C "${LIBRARY}" RESULT_VARIABLE rc OUTPUT_VARIABLE symbols ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  gb_fail("nm ${LIBRARY} failed (${rc}): ${err}")
endif()

set(providers "${SOURCE_DIR}/ops/target_providers")
file(GLOB targets LIST_DIRECTORIES true RELATIVE "${providers}" "${providers}/*")
set(checked 0)
foreach(t IN LISTS targets)
  if(NOT IS_DIRECTORY "${providers}/${t}")
    continue()
  endif()
  declared_functions("${providers}/${t}" names)
  foreach(n IN LISTS names)
    math(EXPR checked "${checked} + 1")
    if(t STREQUAL TARGET)
      if(NOT symbols MATCHES " T genbridge::ops::detail::${n}\\(")
        gb_fail("${LIBRARY}: ${t}'s private kernel function ${n} (declared under ${providers}/${t}/) is not defined in ${t}'s library")
      endif()
    elseif(symbols MATCHES "::${n}\\(")
      string(REGEX MATCH "[^\n]*::${n}\\([^\n]*" line "${symbols}")
      gb_fail("${LIBRARY}: holds ${t}'s private kernel function ${n} (${line}); rule: kernels in ops/target_providers/<Target>/ are compiled into that target's library only")
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  gb_fail("no private kernel functions found under ${providers}/*/: nothing was checked")
endif()
message("checked ${checked} private kernel functions against ${LIBRARY}")
gb_finish()
