# Cross-compiling for 64-bit Arm Linux with clang (the Android NDK's only
# compiler): clang --target=aarch64-linux-gnu, with Debian's
# gcc-aarch64-linux-gnu toolchain for the headers, crt files, libgcc and the
# linker (clang finds it in /usr/lib/gcc-cross/aarch64-linux-gnu), and the
# arm64 multiarch libraries; see .ci/aarch64.sh and cmake/aarch64.cmake.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER clang)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_AR aarch64-linux-gnu-ar CACHE FILEPATH "archiver")
set(CMAKE_RANLIB aarch64-linux-gnu-ranlib CACHE FILEPATH "ranlib")
set(CMAKE_NM aarch64-linux-gnu-nm CACHE FILEPATH "nm")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# pkg-config must describe the arm64 libpcre2-8 / libcjson, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# The multiarch loader and libc at run time, as in cmake/aarch64.cmake.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/;-cpu;max)
