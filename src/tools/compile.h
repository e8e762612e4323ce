/* The .lpx compiler (tools library): writes a loaded model as a compiled
 * .lpx file, which the runtime loads in place (src/model/load_lpx.c). */
#ifndef LP_TOOLS_COMPILE_H
#define LP_TOOLS_COMPILE_H

#include "../model/model.h"

/* Compiling a loaded model into an .lpx file. */
typedef struct lp_compile_params {
    uint32_t weight_type;   /* LP_W4, LP_W8, LP_F16 or LP_F32 */
    int group;              /* W4: 32/64/128; W8: multiple of 32 (0 = 32) */
    bool float_acts;        /* record float activations (W*A16) instead of int8 */
    bool no_search;         /* W4: plain absmax scales instead of the error search */
    bool no_fuse, no_fold;
    bool fold;              /* fold norm gains even into q4 weights (default: not;
                               scaling columns before 4-bit rounding measured worse KL) */
    bool q4_output;         /* q4: pack the classifier in 4 bits too (default: 8-bit) */
    int n_threads;          /* 0: all cores */
    /* progress: after each tensor (i of n, bytes of source weights done/total) */
    void (*progress)(void *user, int i, int n, const char *name, uint64_t done, uint64_t total);
    /* notes: fallbacks and decisions worth telling the user */
    void (*note)(void *user, const char *msg);
    void *user;
} lp_compile_params;

int lp_model_compile(const lp_model *src, const char *out_path, const lp_compile_params *p,
                     lp_error *err);

#endif
