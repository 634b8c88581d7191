# -march=native means "the CPU of the machine that compiles", and our machines differ (AVX-512 on some,
# AVX2 only on others), but the command line does not say which. Neither ninja (a build dir reused on
# another machine) nor ccache (a cache entry made on another machine: it hashes the command line) would
# notice, and the program would die of SIGILL. genbridge_native_isa() names the resolved CPU so that it
# can be put on the command line.

# genbridge_native_isa(<flags> <out var>)
# When <flags> ask for the build machine's CPU (...=native), sets <out var> to "<cpu>_<hash>", where <cpu>
# is what the compiler resolves native to (e.g. znver3) and <hash> hashes its full instruction-set
# expansion (the same CPU name can come with features masked, e.g. in a VM). Empty otherwise.
function(genbridge_native_isa flags out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(NOT flags MATCHES "=native")
    return()
  endif()
  separate_arguments(args UNIX_COMMAND "${flags}")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${args} "-###" -E -x c++ /dev/null
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  # The compiler proper's command line (GCC: cc1plus; Clang: -cc1) holds the expansion.
  string(REGEX MATCH "[^\n]*(cc1plus|\"-cc1\")[^\n]*" proper "${out}")
  if(NOT rc EQUAL 0 OR NOT proper)
    message(WARNING "genbridge: could not learn what '${flags}' means on this machine (${CMAKE_CXX_COMPILER} -### "
                    "failed); a build directory or ccache entry made on another CPU would not be told apart")
    return()
  endif()
  set(cpu native)
  if(proper MATCHES "-march=([A-Za-z0-9_.+-]+)")
    set(cpu ${CMAKE_MATCH_1})
  elseif(proper MATCHES "\"-target-cpu\" \"([A-Za-z0-9_.+-]+)\"")
    set(cpu ${CMAKE_MATCH_1})
  endif()
  string(MD5 hash "${proper}")
  string(SUBSTRING "${hash}" 0 12 hash)
  string(REGEX REPLACE "[^A-Za-z0-9_]" "_" cpu "${cpu}")
  set(${out_var} "${cpu}_${hash}" PARENT_SCOPE)
endfunction()
