# Cross-compiles for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu and the :arm64 multiarch dev
# packages (scripts/deps.sh installs both). Test executables run under qemu-aarch64 (Debian qemu-user),
# through CMAKE_CROSSCOMPILING_EMULATOR, so gtest discovery and ctest work as in a native build.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Libraries and CMake packages are found through CMAKE_LIBRARY_ARCHITECTURE in the :arm64 packages' multiarch
# directories (/usr/lib/aarch64-linux-gnu), headers in /usr/include, programs on the host.

# The guest's loader and libraries are the multiarch ones (libc6:arm64 and the rest, which the :arm64 dev
# packages install under /lib/aarch64-linux-gnu): "-L /". Not the cross sysroot /usr/aarch64-linux-gnu
# (QEMU_LD_PREFIX): its ld.so (libc6-arm64-cross) is another build of glibc than the multiarch libc.so.6
# it then finds through /etc/ld.so.cache, and with that mix pthread_create hangs.
find_program(GENBRIDGE_QEMU_AARCH64 qemu-aarch64)
if(GENBRIDGE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${GENBRIDGE_QEMU_AARCH64};-L;/")
endif()
