/* Writing LoRA adapters (tools library): .lpa files and merged base GGUFs.
 * Loading and binding adapters is the runtime's (src/model/adapter.h). */
#ifndef LP_TOOLS_ADAPTER_WRITE_H
#define LP_TOOLS_ADAPTER_WRITE_H

#include "../model/adapter.h"

/* Writes the adapter (loaded for a base) as .lpa. dtype: LP_F32, LP_F16,
 * LP_W8 / LP_W4 (int8 / int4 in the integer kernels' layout, group 32; a
 * projection whose input width is not a multiple of 32 is written as F16),
 * or -1 to keep each pair's type. */
int lp_adapter_write_lpa(const lp_adapter *a, const char *path, int dtype, lp_error *err);
/* Writes the adapter (loaded for a base) as a llama.cpp GGUF LoRA, so
 * llama.cpp's tools run the very adapter loraplex runs: the base's
 * conventions undone (folded norm gains divided back out of A, rotary rows
 * in GGUF order), halves as dtype LP_F32 or LP_F16, adapter.lora.alpha =
 * scale x rank when that holds for every pair, else 0 (llama.cpp's "no
 * alpha/r") with each scale folded into its B. */
int lp_adapter_write_gguf(const lp_adapter *a, const char *path, int dtype, lp_error *err);
/* Writes one .lpa whose pair for each weight is every adapter's pair
 * stacked (summed rank, each scale folded into its B columns, the first
 * adapter's dtype): running it on a row costs what running all n on that
 * row costs, the frozen-graph baseline with every adapter compiled in. */
int lp_adapter_write_concat(const lp_adapter *const *adapters, int n, const char *path, lp_error *err);
/* Writes `base` (a GGUF base) with W' = W + scale * B A of every adapter
 * folded in: adapted projections as F32, everything else as stored, all
 * metadata copied. The per-task merged baseline. */
int lp_adapter_merge(const lp_model *base, const lp_adapter *const *adapters, int n,
                     const char *out_path, lp_error *err);

#endif
