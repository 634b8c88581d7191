# Helpers for the build.* script-mode tests: run a command, compare its output, report every mismatch,
# fail at the end. CMake reflows long error messages (line breaks and indents at spaces, two spaces after
# a period); comparisons of messages are made on both texts with every whitespace run made one space.

set_property(GLOBAL PROPERTY GB_EXPECT_FAILURES 0)

# gb_run(<rc var> <output var> <command>...): stdout and stderr together.
function(gb_run rc_var out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# gb_flatten(<text> <out var>): every run of spaces and line breaks becomes one space.
function(gb_flatten text out_var)
  string(REGEX REPLACE "[ \n]+" " " flat "${text}")
  set(${out_var} "${flat}" PARENT_SCOPE)
endfunction()

function(gb_fail what)
  get_property(n GLOBAL PROPERTY GB_EXPECT_FAILURES)
  math(EXPR n "${n} + 1")
  set_property(GLOBAL PROPERTY GB_EXPECT_FAILURES ${n})
  message("FAIL: ${what}")
endfunction()

# gb_expect_failure(<what> <rc> <output> <message>...): the command failed (CMake error, non-zero exit)
# and its output contains every <message> verbatim.
function(gb_expect_failure what rc out)
  gb_flatten("${out}" flat)
  if(rc EQUAL 0)
    gb_fail("${what}: expected a failure, got exit status 0; output:\n${out}")
    return()
  endif()
  if(NOT flat MATCHES "CMake Error")
    gb_fail("${what}: exit status ${rc} without a CMake error; output:\n${out}")
  endif()
  foreach(msg IN LISTS ARGN)
    gb_flatten("${msg}" msg)
    string(FIND "${flat}" "${msg}" at)
    if(at LESS 0)
      gb_fail("${what}: the output lacks\n  ${msg}\noutput:\n${out}")
    endif()
  endforeach()
endfunction()

# gb_expect_success(<what> <rc> <output> <text>...): the command succeeded without a CMake error and its
# output contains every <text> verbatim.
function(gb_expect_success what rc out)
  if(NOT rc EQUAL 0 OR out MATCHES "CMake Error")
    gb_fail("${what}: expected success, got exit status ${rc}; output:\n${out}")
    return()
  endif()
  foreach(text IN LISTS ARGN)
    string(FIND "${out}" "${text}" at)
    if(at LESS 0)
      gb_fail("${what}: the output lacks\n  ${text}\noutput:\n${out}")
    endif()
  endforeach()
endfunction()

# gb_finish(): fails the test when any expectation failed.
function(gb_finish)
  get_property(n GLOBAL PROPERTY GB_EXPECT_FAILURES)
  if(n GREATER 0)
    message(FATAL_ERROR "${n} expectation(s) failed")
  endif()
  message("all expectations met")
endfunction()
