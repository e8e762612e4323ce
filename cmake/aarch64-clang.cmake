# Cross-compiling for 64-bit Arm Linux with clang (the Android NDK's only
# compiler): cmake/aarch64.cmake's settings (sysroot paths, arm64 pkg-config,
# qemu), with clang --target=aarch64-linux-gnu in place of gcc. Debian's
# gcc-aarch64-linux-gnu toolchain still provides the headers, crt files,
# libgcc and the linker (clang finds it in /usr/lib/gcc-cross/aarch64-linux-gnu)
# and the binutils below; see .ci/aarch64.sh.
include(${CMAKE_CURRENT_LIST_DIR}/aarch64.cmake)
set(CMAKE_C_COMPILER clang)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_AR aarch64-linux-gnu-ar CACHE FILEPATH "archiver")
set(CMAKE_RANLIB aarch64-linux-gnu-ranlib CACHE FILEPATH "ranlib")
set(CMAKE_NM aarch64-linux-gnu-nm CACHE FILEPATH "nm")
