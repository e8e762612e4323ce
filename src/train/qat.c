/* Quantization-aware LoRA fine-tuning, after QUAD (../shared/papers): an
 * adapter stored as int4 loses accuracy to rounding, so it is fine-tuned
 * from its FP32 weights while the forward pass sees exactly the values the
 * stored file will hold. Each step the LoRA group is saved, replaced by its
 * fake-quantized copy (packed as `adapter compile --dtype i4|i8` packs it,
 * then unpacked), run forward and backward, and restored before the
 * optimizer step: the gradient taken at the rounded point updates the FP32
 * weights (the straight-through estimator). */
#include <math.h>
#include <string.h>

#include "train_internal.h"

/* The LoRA shape of an adapter: one rank, one alpha/rank scale and one set
 * of target projections in every layer (what our trainer's config holds). */
int lp_train_config_from_adapter(const lp_adapter *a, lp_train_config *c, lp_error *err) {
    if (!a->base || a->base->hp.n_layers != c->n_layers)
        return lp_fail(err, "%s: not loaded for a base of %d layers", a->name, c->n_layers);
    if (a->profile_id)
        return lp_fail(err, "%s: holds codes of a shared profile; train from its FP32 original", a->name);
    int rank = 0;
    float scale = 0;
    uint32_t targets = 0;
    for (int l = 0; l < c->n_layers; l++) {
        uint32_t here = 0;
        for (int p = 0; p < LP_PROJ_COUNT; p++) {
            const lp_lora_pair *pair = lp_llama_pair(a, l, (lp_proj)p);
            if (!pair) continue;
            here |= 1u << p;
            if (!rank) {
                rank = pair->rank;
                scale = pair->scale;
            }
            if (pair->rank != rank || pair->scale != scale)
                return lp_fail(err, "%s: layer %d mixes ranks or scales (%d, %g vs %d, %g); the trainer "
                                    "needs one of each", a->name, l, pair->rank, (double)pair->scale, rank,
                               (double)scale);
        }
        if (l == 0) targets = here;
        if (here != targets) return lp_fail(err, "%s: layer %d adapts other projections than layer 0", a->name, l);
    }
    if (!rank) return lp_fail(err, "%s: the adapter is empty", a->name);
    c->lora_rank = rank;
    c->lora_alpha = scale * (float)rank;
    c->lora_targets = targets;
    return 0;
}

/* Copies the adapter's A and B (any stored type, B without its padding). */
int lp_train_lora_from_adapter(lp_train_model *m, const lp_adapter *a, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    int64_t widest_b = 0; /* a packed B row is wider than the rank */
    for (int i = 0; i < a->n_pairs; i++)
        if (a->pairs[i].B.cols > widest_b) widest_b = a->pairs[i].B.cols;
    float *row = lp_alloc((size_t)(widest_b > 0 ? widest_b : 1) * sizeof(float));
    if (!row) return lp_fail(err, "out of memory");
    int rc = 0;
    for (int l = 0; l < c->n_layers && rc == 0; l++)
        for (int p = 0; p < LP_PROJ_COUNT && rc == 0; p++) {
            float *A = m->w.layers[l].lora_a[p], *B = m->w.layers[l].lora_b[p];
            if (!A) continue;
            const lp_lora_pair *pair = lp_llama_pair(a, l, (lp_proj)p);
            int r = c->lora_rank;
            size_t in = lp_t_lora_rows_in(c, p), out = lp_t_lora_rows_out(c, p);
            if (!pair || pair->rank != r || (size_t)pair->A.cols != in || (size_t)pair->B.rows != out) {
                rc = lp_fail(err, "%s: layer %d projection %d does not match the trainer's shapes", a->name, l, p);
                break;
            }
            for (int i = 0; i < r; i++) lp_weight_dequantize_row(&pair->A, i, A + (size_t)i * in);
            for (size_t o = 0; o < out; o++) {
                lp_weight_dequantize_row(&pair->B, (int64_t)o, row);
                memcpy(B + o * (size_t)r, row, (size_t)r * sizeof(float));
            }
        }
    lp_free(row);
    return rc;
}

/* rows x cols (cols <= padded) in place -> packed as `type` (group 32,
 * zero columns up to `padded`) -> back to floats. */
static int fake_quantize(uint32_t type, float *x, int64_t rows, int64_t cols, int64_t padded, float *tmp,
                         uint8_t *packed) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(tmp + r * padded, x + r * cols, (size_t)cols * sizeof(float));
        for (int64_t k = cols; k < padded; k++) tmp[r * padded + k] = 0.0f;
    }
    if (lp_pack_weight(type, 32, tmp, rows, padded, packed)) return -1;
    lp_weight w = lp_packed_weight(type, 32, rows, padded, packed);
    for (int64_t r = 0; r < rows; r++) {
        lp_weight_dequantize_row(&w, r, tmp);
        memcpy(x + r * cols, tmp, (size_t)cols * sizeof(float));
    }
    return 0;
}

int lp_train_fake_quantize_lora(lp_train_model *m, uint32_t type, float *keep, lp_error *err) {
    const lp_train_config *c = &m->cfg;
    int gi = lp_train_group_index(LP_TRAIN_LORA);
    if (c->lora_rank <= 0 || !m->group[gi]) return lp_fail(err, "the model has no LoRA");
    if (type != LP_W4 && type != LP_W8) return lp_fail(err, "fake quantization is for W4 or W8");
    memcpy(keep, m->group[gi], m->group_size[gi] * sizeof(float));
    int64_t r = c->lora_rank, rp = (r + 31) & ~(int64_t)31;
    size_t floats = 0, bytes = 0; /* the largest half, unpacked and packed */
    for (int p = 0; p < LP_PROJ_COUNT; p++) {
        int64_t in = (int64_t)lp_t_lora_rows_in(c, p), out = (int64_t)lp_t_lora_rows_out(c, p);
        size_t f = (size_t)(r * in > out * rp ? r * in : out * rp);
        size_t b = lp_pack_bytes(type, r, in, 32), bb = lp_pack_bytes(type, out, rp, 32);
        if (f > floats) floats = f;
        if (b > bytes) bytes = b;
        if (bb > bytes) bytes = bb;
    }
    float *tmp = lp_alloc(floats * sizeof(float));
    uint8_t *packed = lp_alloc(bytes ? bytes : 1);
    int rc = 0;
    if (!tmp || !packed) rc = lp_fail(err, "out of memory");
    for (int l = 0; l < c->n_layers && rc == 0; l++)
        for (int p = 0; p < LP_PROJ_COUNT && rc == 0; p++) {
            float *A = m->w.layers[l].lora_a[p], *B = m->w.layers[l].lora_b[p];
            if (!A) continue;
            int64_t in = (int64_t)lp_t_lora_rows_in(c, p), out = (int64_t)lp_t_lora_rows_out(c, p);
            /* A's groups run along its input; an input that is not a multiple
             * of 32 stays F16 in the .lpa, close enough to leave as is */
            if (in % 32 == 0 && fake_quantize(type, A, r, in, in, tmp, packed))
                rc = lp_fail(err, "cannot fake-quantize layer %d's A", l);
            if (rc == 0 && in % 32 == 0 && fake_quantize(type, B, out, r, rp, tmp, packed))
                rc = lp_fail(err, "cannot fake-quantize layer %d's B", l);
        }
    lp_free(tmp);
    lp_free(packed);
    if (rc) memcpy(m->group[gi], keep, m->group_size[gi] * sizeof(float));
    return rc;
}

void lp_train_restore_lora(lp_train_model *m, const float *keep) {
    int gi = lp_train_group_index(LP_TRAIN_LORA);
    memcpy(m->group[gi], keep, m->group_size[gi] * sizeof(float));
}
