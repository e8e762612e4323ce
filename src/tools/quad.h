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

/* Observed LoRA-branch activations, by weight id: the shrink's input x and
 * output t = x A^T; their ranges and, with n_bins > 0, histograms of n_bins
 * equal bins over each range. With histograms a profile's activation
 * encodings are the clipped ranges of least expected squared error
 * (lp_qenc_mse); without, the observed min / max. */
typedef struct lp_quad_acts {
    int n_weights, n_bins;
    float *x_lo, *x_hi, *t_lo, *t_hi;
    double *x_hist, *t_hist; /* [n_weights][n_bins], or NULL */
} lp_quad_acts;

#define LP_QUAD_MAX_BINS 1024
/* n_bins: 0 (ranges only) to LP_QUAD_MAX_BINS. */
int lp_quad_acts_init(lp_quad_acts *a, int n_weights, int n_bins, lp_error *err);
void lp_quad_acts_free(lp_quad_acts *a);
/* dst widened to hold src; histograms (when both have them) re-binned onto
 * the widened ranges and added. */
void lp_quad_acts_union(lp_quad_acts *dst, const lp_quad_acts *src);

/* The encoding on codes 0..qmax of a clipped range [a, b] within [lo, hi]
 * (holding 0) that minimises the expected squared error over the histogram
 * h[0..nb) of equal bins over [lo, hi]: step^2 / 12 for a value inside the
 * codes' range, the distance to its end squared for one outside. The
 * clipped ends are searched on a grid of fractions of lo and hi. */
lp_qenc lp_qenc_mse(const double *h, int nb, float lo, float hi, int qmax);

/* A profile for `base`: the weight encodings from the min / max of every
 * adapter in fps[0..n) together at each tensor position (per tensor or per
 * output channel), the activation encodings from `acts`; bits 8 or 4.
 * Every adapter must adapt the same weights with the same ranks. */
int lp_quad_build_profile(const lp_model *base, const lp_quad_lora *const *fps, int n, const lp_quad_acts *acts,
                          int bits, int granularity, int strategy, const char *anchor, lp_lpq *out,
                          lp_error *err);

/* Writes the profile in Qualcomm AIMET's encodings JSON layout (docs/quad.md):
 * param_encodings for "<weight>.lora_A" / ".lora_B" (one encoding per
 * channel or one per tensor), activation_encodings for "<weight>.lora_x"
 * (the shrink's input) and "<weight>.lora_t" (its output). */
int lp_quad_export_aimet(const lp_lpq *profile, const char *path, lp_error *err);

#endif
