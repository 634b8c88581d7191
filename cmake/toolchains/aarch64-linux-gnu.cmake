# Cross-compiles for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu and the :arm64 multiarch dev
# packages (scripts/deps.sh installs both). Test executables run under qemu-aarch64 (Debian qemu-user),
# through CMAKE_CROSSCOMPILING_EMULATOR, so gtest discovery and ctest work as in a native build.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Headers and libraries from the :arm64 packages (/usr/include, /usr/lib/aarch64-linux-gnu) and the
# cross sysroot; programs (cmake helpers, node) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(GENBRIDGE_QEMU_AARCH64 qemu-aarch64)
if(GENBRIDGE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${GENBRIDGE_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu")
endif()
