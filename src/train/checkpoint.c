/* Training checkpoints: everything needed to continue bit-identically.
 *
 * Layout (little-endian, no padding):
 *   char[8]  magic "LPTRAIN\0"
 *   u32      version (1)
 *   u32      trainable groups (LP_TRAIN_* bits)
 *   i32 x10  n_vocab dim n_layers n_heads n_kv_heads head_dim ffn_dim n_ctx n_extra lora_rank
 *   f32 x3   rope_theta rms_eps lora_alpha
 *   u32 x2   tied_output lora_targets
 *   f32 x2   lr min_lr;  i32 x2 warmup total_steps
 *   f32 x5   beta1 beta2 eps weight_decay grad_clip
 *   u64      optimizer step
 *   u64 x4   RNG state
 *   u64 x3   floats in the base, lora and extra groups
 *   f32[]    base, lora, extra parameters
 *   f32[]    for each trainable group in that order: Adam m, then v
 * The reader checks every size against the configuration and the file
 * length before allocating anything. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

static const char lp_ckpt_magic[8] = {'L', 'P', 'T', 'R', 'A', 'I', 'N', 0};
enum { LP_CKPT_VERSION = 1 };

/* ---- writing -------------------------------------------------------------------- */

typedef struct ckpt_out {
    FILE *f;
    bool failed;
} ckpt_out;

static void put(ckpt_out *o, const void *p, size_t n) {
    if (!o->failed && n && fwrite(p, 1, n, o->f) != n) o->failed = true;
}
static void put_u32(ckpt_out *o, uint32_t v) { put(o, &v, 4); }
static void put_i32(ckpt_out *o, int32_t v) { put(o, &v, 4); }
static void put_f32(ckpt_out *o, float v) { put(o, &v, 4); }
static void put_u64(ckpt_out *o, uint64_t v) { put(o, &v, 8); }

int lp_checkpoint_save(const char *path, const lp_train_model *m, const lp_adamw *opt,
                       const lp_rng *rng, lp_error *err) {
    /* Write to a temporary name and rename, so a crash never leaves a torn
     * checkpoint where the last good one was. */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return lp_fail(err, "%s: path too long", path);
    ckpt_out o = {fopen(tmp, "wb"), false};
    if (!o.f) return lp_fail(err, "%s: cannot create", tmp);
    const lp_train_config *c = &m->cfg;
    const lp_adamw_config *a = &opt->cfg;
    put(&o, lp_ckpt_magic, 8);
    put_u32(&o, LP_CKPT_VERSION);
    put_u32(&o, (uint32_t)m->trainable);
    int32_t ints[10] = {c->n_vocab, c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
                        c->head_dim, c->ffn_dim, c->n_ctx, c->n_extra, c->lora_rank};
    for (int i = 0; i < 10; i++) put_i32(&o, ints[i]);
    put_f32(&o, c->rope_theta);
    put_f32(&o, c->rms_eps);
    put_f32(&o, c->lora_alpha);
    put_u32(&o, c->tied_output);
    put_u32(&o, c->lora_targets);
    put_f32(&o, a->lr);
    put_f32(&o, a->min_lr);
    put_i32(&o, a->warmup);
    put_i32(&o, a->total_steps);
    float fl[5] = {a->beta1, a->beta2, a->eps, a->weight_decay, a->grad_clip};
    for (int i = 0; i < 5; i++) put_f32(&o, fl[i]);
    put_u64(&o, (uint64_t)opt->step);
    for (int i = 0; i < 4; i++) put_u64(&o, rng->s[i]);
    for (int g = 0; g < 3; g++) put_u64(&o, m->group_size[g]);
    for (int g = 0; g < 3; g++) put(&o, m->group[g], m->group_size[g] * sizeof(float));
    for (int g = 0; g < 3; g++)
        if (m->grad[g]) {
            put(&o, opt->m[g], m->group_size[g] * sizeof(float));
            put(&o, opt->v[g], m->group_size[g] * sizeof(float));
        }
    if (fclose(o.f) != 0) o.failed = true;
    if (o.failed) {
        remove(tmp);
        return lp_fail(err, "%s: write failed (disk full?)", tmp);
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return lp_fail(err, "%s: cannot rename %s into place", path, tmp);
    }
    return 0;
}

/* ---- reading --------------------------------------------------------------------- */

typedef struct ckpt_in {
    const uint8_t *p;
    size_t left;
    bool short_read;
} ckpt_in;

static void get(ckpt_in *in, void *dst, size_t n) {
    if (n == 0) return;
    if (in->short_read || n > in->left) {
        in->short_read = true;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, in->p, n);
    in->p += n;
    in->left -= n;
}
static uint32_t get_u32(ckpt_in *in) { uint32_t v; get(in, &v, 4); return v; }
static int32_t get_i32(ckpt_in *in) { int32_t v; get(in, &v, 4); return v; }
static float get_f32(ckpt_in *in) { float v; get(in, &v, 4); return v; }
static uint64_t get_u64(ckpt_in *in) { uint64_t v; get(in, &v, 8); return v; }

static int check_adamw(const lp_adamw_config *a, const char *name, lp_error *err) {
    bool ok = isfinite(a->lr) && a->lr >= 0 && isfinite(a->min_lr) && a->min_lr >= 0 &&
              a->warmup >= 0 && a->total_steps >= 0 && a->beta1 >= 0 && a->beta1 < 1 &&
              a->beta2 >= 0 && a->beta2 < 1 && isfinite(a->eps) && a->eps > 0 &&
              isfinite(a->weight_decay) && a->weight_decay >= 0 && isfinite(a->grad_clip) &&
              a->grad_clip >= 0;
    return ok ? 0 : lp_fail(err, "%s: optimizer settings out of range", name);
}

int lp_checkpoint_load_memory(const void *data, size_t size, const char *name,
                              lp_train_model **model, lp_adamw *opt, lp_rng *rng,
                              lp_error *err) {
    *model = NULL;
    memset(opt, 0, sizeof *opt);
    ckpt_in in = {data, size, false};
    char magic[8];
    get(&in, magic, 8);
    if (in.short_read || memcmp(magic, lp_ckpt_magic, 8) != 0)
        return lp_fail(err, "%s: not a loraplex training checkpoint (bad magic)", name);
    uint32_t version = get_u32(&in);
    if (version != LP_CKPT_VERSION)
        return lp_fail(err, "%s: checkpoint version %u is not supported (want %d)", name,
                       version, LP_CKPT_VERSION);
    uint32_t trainable = get_u32(&in);
    lp_train_config c = {0};
    int32_t ints[10];
    for (int i = 0; i < 10; i++) ints[i] = get_i32(&in);
    c.n_vocab = ints[0], c.dim = ints[1], c.n_layers = ints[2], c.n_heads = ints[3];
    c.n_kv_heads = ints[4], c.head_dim = ints[5], c.ffn_dim = ints[6], c.n_ctx = ints[7];
    c.n_extra = ints[8], c.lora_rank = ints[9];
    c.rope_theta = get_f32(&in);
    c.rms_eps = get_f32(&in);
    c.lora_alpha = get_f32(&in);
    uint32_t tied = get_u32(&in);
    c.lora_targets = get_u32(&in);
    c.tied_output = tied != 0;
    lp_adamw_config a = {0};
    a.lr = get_f32(&in);
    a.min_lr = get_f32(&in);
    a.warmup = get_i32(&in);
    a.total_steps = get_i32(&in);
    a.beta1 = get_f32(&in);
    a.beta2 = get_f32(&in);
    a.eps = get_f32(&in);
    a.weight_decay = get_f32(&in);
    a.grad_clip = get_f32(&in);
    uint64_t step = get_u64(&in);
    lp_rng r;
    for (int i = 0; i < 4; i++) r.s[i] = get_u64(&in);
    uint64_t counts[3];
    for (int g = 0; g < 3; g++) counts[g] = get_u64(&in);
    if (in.short_read) return lp_fail(err, "%s: truncated header", name);
    if (tied > 1 || trainable > 7 || trainable == 0 || step > (1ull << 40))
        return lp_fail(err, "%s: corrupt header fields", name);
    if (lp_train_config_check(&c, err) < 0) return lp_fail_prefix(err, "%s", name);
    if (check_adamw(&a, name, err) < 0) return -1;
    if (c.lora_rank == 0 && c.lora_targets != 0)
        return lp_fail(err, "%s: LoRA targets without a rank", name);

    /* Sizes implied by the configuration must match the stored counts, and
     * the file must hold them all, before anything is allocated. */
    size_t expect[3];
    if (lp_t_param_counts(&c, expect, err) < 0) return lp_fail_prefix(err, "%s", name);
    size_t floats = 0;
    for (int g = 0; g < 3; g++) {
        if (counts[g] != expect[g])
            return lp_fail(err, "%s: parameter group %d holds %llu floats, the config needs %zu",
                           name, g, (unsigned long long)counts[g], expect[g]);
        bool moments = (trainable & (1u << g)) && expect[g] > 0;
        size_t n = expect[g];
        if ((moments && !lp_mul_ok(n, 3, &n)) || !lp_add_ok(floats, n, &floats))
            return lp_fail(err, "%s: sizes overflow", name);
    }
    size_t bytes;
    if (!lp_mul_ok(floats, sizeof(float), &bytes) || bytes != in.left)
        return lp_fail(err, "%s: expected %zu bytes of tensors after the header, found %zu",
                       name, floats * sizeof(float), in.left);

    lp_train_model *m = lp_train_model_create(&c, (int)trainable, err);
    if (!m) return lp_fail_prefix(err, "%s", name);
    if (m->trainable != (int)trainable) {
        lp_train_model_free(m);
        return lp_fail(err, "%s: trainable groups %u don't exist in this model", name, trainable);
    }
    opt->cfg = a;
    if (lp_adamw_init(opt, m, &a, err) < 0) {
        lp_train_model_free(m);
        return -1;
    }
    opt->step = (long)step;
    for (int g = 0; g < 3; g++) get(&in, m->group[g], m->group_size[g] * sizeof(float));
    for (int g = 0; g < 3; g++)
        if (m->grad[g]) {
            get(&in, opt->m[g], m->group_size[g] * sizeof(float));
            get(&in, opt->v[g], m->group_size[g] * sizeof(float));
        }
    if (in.short_read || in.left != 0) {   /* cannot happen after the size check */
        lp_adamw_free(opt);
        lp_train_model_free(m);
        return lp_fail(err, "%s: size mismatch", name);
    }
    *rng = r;
    *model = m;
    return 0;
}

int lp_checkpoint_load(const char *path, lp_train_model **model, lp_adamw *opt, lp_rng *rng,
                       lp_error *err) {
    lp_mapped_file f;
    if (lp_map_file(path, &f, err) < 0) return -1;
    int rc = lp_checkpoint_load_memory(f.data, f.size, path, model, opt, rng, err);
    lp_unmap_file(&f);
    return rc;
}
