/* The NEON integer kernels once more, with pairs of batch rows through the
 * int8 matrix multiply-accumulate (smmla; Armv8.6 i8mm: Neoverse V1/N2,
 * Cortex-X2/A710 and later, Apple M2 and later). lp_kernels_init picks them
 * for batches of 2+ rows when getauxval reports i8mm; same bits as every
 * other level (see intmatmul_neon.c). */
#define LP_NEON_I8MM 1
#include "intmatmul_neon.c"
