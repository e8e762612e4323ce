/* The AVX-512 VNNI kernel for W4C once more, built with AVX512-VBMI (Ice
 * Lake, Sapphire Rapids, Zen 4 and later): its nibbles unpack by vpermb
 * with no mask (see lp_unpack_nibbles512). lp_kernels_init picks it when
 * the CPU has VBMI; same bits as every other level. */
#define LP_PACKED_VBMI 1
#include "intmatmul_avx512.c"
