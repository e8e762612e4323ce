/* QUAD tools (docs/quad.md): FP32 LoRA weights by weight id, the shared
 * encodings made from them, and adapters quantized under a profile
 * (.lpa version 3: codes only). The trainer's side (QSS, calibration, the
 * distillation) is in src/train/quad.c. */
#ifndef LP_TOOLS_QUAD_H
#define LP_TOOLS_QUAD_H

#include "../formats/lpq.h"
#include "../model/adapter.h"

/* One adapter's FP32 LoRA, indexed by the base's weight id. */
typedef struct lp_quad_lora {
    const lp_model *base;
    char name[256];
    int n_weights;
    int *rank;         /* [n_weights] 0 where not adapted */
    float *scale;      /* [n_weights] alpha / rank */
    float **A, **B;    /* [n_weights] rank x in, out x rank (owned) */
} lp_quad_lora;

/* FP32 copy of a loaded (F32 / F16 / W8 / W4) adapter. */
int lp_quad_lora_from_adapter(lp_quad_lora *q, const lp_adapter *a, lp_error *err);
void lp_quad_lora_free(lp_quad_lora *q);

/* Min / max per channel (rows; n_ch == rows) or of the whole matrix
 * (n_ch == 1), widened into lo/hi (start them at +inf / -inf). */
void lp_quad_ranges(const float *m, int rows, int cols, int n_ch, float *lo, float *hi);

/* Writes `fp` quantized under `profile` (codes of its encodings) as an
 * .lpa version 3 for `base` (its fingerprint). Every adapted weight must be
 * in the profile with the same rank, and vice versa. */
int lp_quad_write_adapter(const char *path, const lp_model *base, const lp_lpq *profile,
                          const lp_quad_lora *fp, lp_error *err);

/* In place: every A and B replaced by its value under the profile's
 * encodings (what the codes stand for). */
void lp_quad_fake_quantize(lp_quad_lora *fp, const lp_lpq *profile);

#endif
