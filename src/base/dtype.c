#include "dtype.h"

/* Block sizes are those of the GGUF specification. */
static const lp_dtype_info k_types[LP_DTYPE_COUNT] = {
    [LP_F32] = {"F32", 1, 4, true},
    [LP_F16] = {"F16", 1, 2, true},
    [LP_Q4_0] = {"Q4_0", 32, 18, true},
    [LP_Q4_1] = {"Q4_1", 32, 20, true},
    [LP_Q5_0] = {"Q5_0", 32, 22, true},
    [LP_Q5_1] = {"Q5_1", 32, 24, true},
    [LP_Q8_0] = {"Q8_0", 32, 34, true},
    [LP_Q8_1] = {"Q8_1", 32, 36, false},
    [LP_Q2_K] = {"Q2_K", 256, 84, false},
    [LP_Q3_K] = {"Q3_K", 256, 110, false},
    [LP_Q4_K] = {"Q4_K", 256, 144, true},
    [LP_Q5_K] = {"Q5_K", 256, 176, true},
    [LP_Q6_K] = {"Q6_K", 256, 210, true},
    [LP_Q8_K] = {"Q8_K", 256, 292, false},
    [LP_I8] = {"I8", 1, 1, false},
    [LP_I16] = {"I16", 1, 2, false},
    [LP_I32] = {"I32", 1, 4, false},
    [LP_I64] = {"I64", 1, 8, false},
    [LP_F64] = {"F64", 1, 8, false},
    [LP_BF16] = {"BF16", 1, 2, true},
};

/* Packed formats, per row at group 32: 32 codes + one scale. */
static const lp_dtype_info k_own_types[LP_DTYPE_OWN_END - LP_W4] = {
    [LP_W4 - LP_W4] = {"W4", 32, 18, true},
    [LP_W8 - LP_W4] = {"W8", 32, 34, true},
    [LP_W4C - LP_W4] = {"W4C", 32, 17, true}, /* + 4 bytes per row */
};

const lp_dtype_info *lp_dtype_get(uint32_t type_id) {
    if (type_id >= LP_W4 && type_id < LP_DTYPE_OWN_END) return &k_own_types[type_id - LP_W4];
    if (type_id >= LP_DTYPE_COUNT || k_types[type_id].name == NULL) return NULL;
    return &k_types[type_id];
}

size_t lp_dtype_row_bytes(uint32_t type_id, uint64_t n) {
    const lp_dtype_info *t = lp_dtype_get(type_id);
    if (!t || n % (uint64_t)t->block_elems != 0) return 0;
    uint64_t blocks = n / (uint64_t)t->block_elems;
    if (blocks > SIZE_MAX / (uint64_t)t->block_bytes) return 0;
    return (size_t)(blocks * (uint64_t)t->block_bytes);
}

const char *lp_dtype_name(uint32_t type_id) {
    const lp_dtype_info *t = lp_dtype_get(type_id);
    return t ? t->name : "unknown";
}
