# Cross-compiling for 64-bit Arm Linux with Debian's gcc-aarch64-linux-gnu
# and arm64 multiarch libraries (see .ci/aarch64.sh). Tests run through
# qemu-aarch64 with every CPU feature (-cpu max: NEON dotprod included).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# pkg-config must describe the arm64 libpcre2-8 / libcjson, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Run with the arm64 multiarch loader and libc (libc6:arm64, pulled in by the
# -dev:arm64 packages): mixing the cross toolchain's ld.so
# (/usr/aarch64-linux-gnu, a different glibc build) with that libc.so.6
# hangs in pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/;-cpu;max)
