# build.installed_package_consumer: installs this build (cmake --install into a scratch prefix), builds
# tests/consumer against it with find_package(genbridge) and runs it. Only the consumer is compiled.
#   cmake -DBUILD_DIR=<build> -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DWANT_TARGET=<t> -DWANT_SOC=<soc>
#         -DGENERATOR=<g> -DCXX=<compiler> [-DLAUNCHER=<ccache>] -DBUILD_TYPE=<type>
#         -DLIBDIR=<dir> -DINCLUDEDIR=<dir> -DDATADIR=<dir> (the build's CMAKE_INSTALL_*) -P installed_package_consumer.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/expect.cmake)

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")

gb_run(rc out ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
gb_expect_success("cmake --install ${BUILD_DIR}" "${rc}" "${out}")
string(TOLOWER "${WANT_TARGET}" target_lower)
foreach(f "${LIBDIR}/libgenbridge_ops_${target_lower}.a" "${LIBDIR}/cmake/genbridge/genbridgeConfig.cmake"
          "${INCLUDEDIR}/genbridge/build_info.h" "${DATADIR}/genbridge/manifest.json")
  if(NOT EXISTS "${prefix}/${f}")
    gb_fail("the install lacks ${f}; it holds:\n${out}")
  endif()
endforeach()
gb_finish()  # nothing to build against otherwise

# Configure the consumer against the prefix only: the source tree is not on any path it is given.
set(args -S "${SOURCE_DIR}/tests/consumer" -B "${consumer_build}" -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}"
         "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}" "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(LAUNCHER)
  list(APPEND args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()
gb_run(rc out ${CMAKE_COMMAND} ${args})
gb_expect_success("configure tests/consumer" "${rc}" "${out}"
                  "consumer sees genbridge target ${WANT_TARGET} (SoC ${WANT_SOC})")
gb_finish()
file(STRINGS "${consumer_build}/CMakeCache.txt" found REGEX "^genbridge_DIR:")
if(NOT found STREQUAL "genbridge_DIR:PATH=${prefix}/${LIBDIR}/cmake/genbridge")
  gb_fail("find_package(genbridge) found '${found}', not the installed package under ${prefix}")
endif()

gb_run(rc out ${CMAKE_COMMAND} --build "${consumer_build}")
gb_expect_success("build tests/consumer" "${rc}" "${out}")
gb_finish()

gb_run(rc out "${consumer_build}/genbridge_consumer")
gb_expect_success("run genbridge_consumer" "${rc}" "${out}" "target=${WANT_TARGET} soc=${WANT_SOC}\n" "norm ok\n")
gb_finish()
