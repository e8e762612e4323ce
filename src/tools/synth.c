/* Random-weight model and LoRA adapter generator (see synth.h).
 *
 * Files are laid out the way llama.cpp's convert_hf_to_gguf.py writes a
 * converted model: the same keys and tensor names, norms/biases in F32,
 * matrices in the requested type. Values follow the recipe of the tiny
 * random models in shared/models/arch/README.md:
 *
 *   token_embd / output rows   N(0,1) rows rescaled to length sqrt(dim)
 *   q, k, v, gate, up          N(0, 1/fan_in)
 *   attn_output, ffn_down      N(0, 4/fan_in) * 2/max(2, n_layers)
 *                              (variance; the extra factor keeps the total
 *                              that all layers add to the residual stream
 *                              the same as a 2-layer model's, so deep
 *                              presets do not drown the embedding)
 *   attn/ffn/q/k norms         U(0.5, 1.5)
 *   output_norm                U(0.5, 1.5) * 32/sqrt(dim)  (x8 at dim 16,
 *                              x4 at dim 64 as in README: logits std ~30);
 *                              with random signs when the output is tied
 *                              (see plan_model)
 *   qwen2 q/k/v biases         N(0, 0.25)
 *
 * Every tensor's values depend only on the seed, its name and its shape (each
 * chunk of rows has its own RNG stream seeded from those), so the output is
 * byte-identical whatever the thread count, and an F32 and a Q4_K file from
 * the same seed hold the same model up to rounding.
 *
 * Built-in vocabulary (vocab_path == NULL): a minimal SentencePiece ("llama")
 * vocabulary of 259 tokens: <unk>, <s>, </s> and the 256 byte tokens
 * <0x00>..<0xFF> (type BYTE, score 0). llama.cpp's SPM tokenizer falls back
 * to bytes for every character, so any UTF-8 text encodes. */
#include "synth.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/dtype.h"
#include "../formats/gguf.h"
#include "../kernels/kernels.h"

/* ---- presets ------------------------------------------------------------- */

typedef struct synth_preset {
    const char *name;
    const char *vocab;   /* file in shared/models/arch, NULL: built-in */
    lp_arch arch;
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx;
    float rope_theta, rms_eps;
    bool tied_output, llama3_rope_scaling;
} synth_preset;

static const synth_preset presets[] = {
    {"tinyllama-1.1b", "ggml-vocab-llama-spm.gguf", LP_ARCH_LLAMA,
     2048, 22, 32, 4, 64, 5632, 2048, 10000.0f, 1e-5f, false, false},
    {"llama-3.2-1b", "ggml-vocab-llama-bpe.gguf", LP_ARCH_LLAMA,
     2048, 16, 32, 8, 64, 8192, 131072, 500000.0f, 1e-5f, true, true},
    {"qwen2.5-0.5b", "ggml-vocab-qwen2.gguf", LP_ARCH_QWEN2,
     896, 24, 14, 2, 64, 4864, 32768, 1000000.0f, 1e-6f, true, false},
    {"qwen3-0.6b", "ggml-vocab-qwen2.gguf", LP_ARCH_QWEN3,
     1024, 28, 16, 8, 128, 3072, 40960, 1000000.0f, 1e-6f, true, false},
    {"tiny", NULL, LP_ARCH_LLAMA,
     64, 2, 4, 2, 16, 192, 512, 10000.0f, 1e-5f, false, false},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

static const synth_preset *find_preset(const char *name) {
    for (size_t i = 0; name && i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

int lp_synth_preset(const char *name, lp_synth_params *p, lp_error *err) {
    const synth_preset *s = find_preset(name);
    if (!s) {
        char list[256] = "";
        for (size_t i = 0; i < N_PRESETS; i++) {
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, presets[i].name, sizeof list - strlen(list) - 1);
        }
        return lp_fail(err, "unknown synthetic model preset '%s' (known: %s)",
                       name ? name : "(null)", list);
    }
    memset(p, 0, sizeof *p);
    p->arch = s->arch;
    p->dim = s->dim;
    p->n_layers = s->n_layers;
    p->n_heads = s->n_heads;
    p->n_kv_heads = s->n_kv_heads;
    p->head_dim = s->head_dim;
    p->ffn_dim = s->ffn_dim;
    p->n_ctx = s->n_ctx;
    p->rope_theta = s->rope_theta;
    p->rms_eps = s->rms_eps;
    p->tied_output = s->tied_output;
    p->llama3_rope_scaling = s->llama3_rope_scaling;
    p->weight_type = LP_F16;
    p->embd_type = LP_F16;
    p->seed = 1;
    p->vocab_path = NULL;
    p->name = s->name;
    return 0;
}

const char *lp_synth_preset_vocab(const char *name) {
    const synth_preset *s = find_preset(name);
    return s ? s->vocab : NULL;
}

/* ---- random numbers ---------------------------------------------------- */

/* FNV-1a: a tensor's RNG streams derive from its name. */
static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void seed_stream(lp_rng *rng, uint64_t seed, const char *name, uint64_t chunk) {
    lp_rng_seed(rng, mix64(seed ^ mix64(hash_name(name) + mix64(chunk + 1))));
}

/* Normal samples by Marsaglia & Tsang's ziggurat (in Doornik's formulation):
 * ~99% of samples cost one 64-bit draw and a multiply, no log or sin, which
 * matters for a billion of them. Exact N(0,1), tails included. */
#define ZIG_LAYERS 128
#define ZIG_R 3.442619855899
#define ZIG_AREA 9.91256303526217e-3

typedef struct ziggurat {
    double x[ZIG_LAYERS + 1];      /* layer edges, x[1] = R, x[128] = 0 */
    double ratio[ZIG_LAYERS];      /* x[i+1] / x[i]: fast-accept bound */
} ziggurat;

static void ziggurat_init(ziggurat *z) {
    double f = exp(-0.5 * ZIG_R * ZIG_R);
    z->x[0] = ZIG_AREA / f;        /* base layer: rectangle plus tail */
    z->x[1] = ZIG_R;
    for (int i = 2; i < ZIG_LAYERS; i++) {
        z->x[i] = sqrt(-2.0 * log(ZIG_AREA / z->x[i - 1] + f));
        f = exp(-0.5 * z->x[i] * z->x[i]);
    }
    z->x[ZIG_LAYERS] = 0.0;
    for (int i = 0; i < ZIG_LAYERS; i++) z->ratio[i] = z->x[i + 1] / z->x[i];
}

static double unit_open(lp_rng *rng) { /* (0, 1] */
    return ((double)(lp_rng_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double ziggurat_normal(const ziggurat *z, lp_rng *rng) {
    for (;;) {
        uint64_t bits = lp_rng_u64(rng);
        int i = (int)(bits & (ZIG_LAYERS - 1));
        /* signed uniform in (-1, 1) from the top 53 bits */
        double u = 2.0 * ((double)(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0) - 1.0;
        if (fabs(u) < z->ratio[i]) return u * z->x[i];
        if (i == 0) { /* tail beyond R */
            double tx, ty;
            do {
                tx = -log(unit_open(rng)) / ZIG_R;
                ty = -log(unit_open(rng));
            } while (ty + ty < tx * tx);
            return u < 0 ? -(ZIG_R + tx) : ZIG_R + tx;
        }
        double x = u * z->x[i];
        double f0 = exp(-0.5 * (z->x[i] * z->x[i] - x * x));
        double f1 = exp(-0.5 * (z->x[i + 1] * z->x[i + 1] - x * x));
        if (f1 + (double)lp_rng_uniform(rng) * (f0 - f1) < 1.0) return x;
    }
}

static void fill_normal(const ziggurat *z, lp_rng *rng, float *x, size_t n, float std) {
    for (size_t i = 0; i < n; i++) x[i] = (float)ziggurat_normal(z, rng) * std;
}

static void fill_uniform(lp_rng *rng, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * lp_rng_uniform(rng);
}

/* ---- tensor plan ----------------------------------------------------------- */

typedef enum init_kind {
    INIT_NORMAL,   /* N(0, a^2) */
    INIT_EMBED,    /* N(0,1) rows rescaled to length sqrt(row length) */
    INIT_UNIFORM,  /* U(a, b) */
    INIT_SIGNED,   /* U(a, b) with a random sign */
    INIT_FIXED,    /* data filled by the planner (rope_freqs) */
} init_kind;

typedef struct synth_tensor {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t dims[2];     /* dims[0] = row length, dims[1] = rows */
    init_kind init;
    float a, b;
    size_t row_bytes, n_bytes;
    void *data;
} synth_tensor;

/* A row of n elements must be a whole number of blocks. K-quants (256) do not
 * fit small test dims; like llama.cpp's quantizer we then fall back, here to
 * Q8_0 (block 32) or F16. */
static uint32_t fit_type(uint32_t type, uint64_t n) {
    if (lp_dtype_row_bytes(type, n)) return type;
    if (lp_dtype_row_bytes(LP_Q8_0, n)) return LP_Q8_0;
    return LP_F16;
}

typedef struct tensor_plan {
    synth_tensor *t;
    size_t n, cap;
    bool overflow;
} tensor_plan;

static synth_tensor *plan_add(tensor_plan *pl, const char *name, uint32_t type,
                              uint64_t d0, uint64_t d1, init_kind init, float a,
                              float b) {
    if (pl->overflow || pl->n == pl->cap) {
        pl->overflow = true;
        return NULL;
    }
    synth_tensor *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = fit_type(type, d0);
    t->n_dims = d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1 ? d1 : 1;
    t->init = init;
    t->a = a;
    t->b = b;
    t->row_bytes = lp_dtype_row_bytes(t->type, d0);
    if (!t->row_bytes || !lp_mul_ok(t->row_bytes, t->dims[1], &t->n_bytes))
        pl->overflow = true;
    return t;
}

static void layer_name(char *buf, size_t cap, int layer, const char *what) {
    snprintf(buf, cap, "blk.%d.%s", layer, what);
}

/* Llama 3.1/3.2 "llama3" rope scaling as convert_hf_to_gguf.py stores it:
 * per frequency the factor llama.cpp divides the rotation angle by. */
static void llama3_rope_factors(float *out, int head_dim, float theta) {
    const double factor = 32.0, low = 1.0, high = 4.0, orig_ctx = 8192.0;
    const double low_wavelen = orig_ctx / low, high_wavelen = orig_ctx / high;
    for (int i = 0; i < head_dim / 2; i++) {
        double freq = 1.0 / pow((double)theta, 2.0 * i / head_dim);
        double wavelen = 2.0 * 3.14159265358979323846 / freq;
        double f;
        if (wavelen < high_wavelen) {
            f = 1.0;
        } else if (wavelen > low_wavelen) {
            f = factor;
        } else {
            double smooth = (orig_ctx / wavelen - low) / (high - low);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        out[i] = (float)f;
    }
}

static int check_params(const lp_synth_params *p, lp_error *err) {
    if ((int)p->arch < 0 || (int)p->arch >= LP_ARCH_COUNT)
        return lp_fail(err, "synth: unknown architecture id %d", (int)p->arch);
    if (p->dim < 1 || p->dim > 65536 || p->n_layers < 1 || p->n_layers > 1024 ||
        p->n_heads < 1 || p->n_heads > 1024 || p->n_kv_heads < 1 ||
        p->head_dim < 2 || p->head_dim > 1024 || p->ffn_dim < 1 ||
        p->ffn_dim > 1 << 20 || p->n_ctx < 1)
        return lp_fail(err, "synth: dimensions out of range (dim %d, layers %d, "
                       "heads %d/%d, head_dim %d, ffn %d, ctx %d)", p->dim,
                       p->n_layers, p->n_heads, p->n_kv_heads, p->head_dim,
                       p->ffn_dim, p->n_ctx);
    if (p->n_heads % p->n_kv_heads != 0)
        return lp_fail(err, "synth: n_heads %d is not a multiple of n_kv_heads %d",
                       p->n_heads, p->n_kv_heads);
    if (p->head_dim % 2 != 0)
        return lp_fail(err, "synth: head_dim %d must be even (RoPE pairs)", p->head_dim);
    if (!(p->rope_theta > 0.0f) || !(p->rms_eps > 0.0f) || !isfinite(p->rope_theta))
        return lp_fail(err, "synth: rope_theta and rms_eps must be positive");
    static const uint32_t producible[] = {LP_F32, LP_F16, LP_BF16, LP_Q8_0, LP_Q4_0,
                                          LP_Q4_1, LP_Q5_0, LP_Q5_1, LP_Q4_K,
                                          LP_Q5_K, LP_Q6_K};
    const uint32_t types[2] = {p->weight_type, p->embd_type};
    for (int k = 0; k < 2; k++) {
        bool ok = false;
        for (size_t i = 0; i < sizeof producible / sizeof producible[0]; i++)
            ok = ok || producible[i] == types[k];
        if (!ok)
            return lp_fail(err, "synth: cannot write %s tensors of type %s (id %u)",
                           k ? "embedding" : "weight", lp_dtype_name(types[k]),
                           types[k]);
    }
    return 0;
}

/* Lists every tensor in convert_hf_to_gguf.py's order. */
static void plan_model(tensor_plan *pl, const lp_synth_params *p, uint64_t n_vocab) {
    const uint64_t dim = (uint64_t)p->dim, ffn = (uint64_t)p->ffn_dim;
    const uint64_t q_dim = (uint64_t)p->n_heads * (uint64_t)p->head_dim;
    const uint64_t kv_dim = (uint64_t)p->n_kv_heads * (uint64_t)p->head_dim;
    const uint64_t head_dim = (uint64_t)p->head_dim;
    const uint32_t wt = p->weight_type;
    const float in_std = 1.0f / sqrtf((float)dim);
    /* 2/sqrt(fan_in) for two layers, shrinking as 1/sqrt(layers) beyond. */
    const float depth = sqrtf(2.0f / (float)(p->n_layers > 2 ? p->n_layers : 2));
    char name[64];

    if (p->llama3_rope_scaling)
        plan_add(pl, "rope_freqs.weight", LP_F32, (uint64_t)p->head_dim / 2, 0,
                 INIT_FIXED, 0, 0);
    plan_add(pl, "token_embd.weight", p->embd_type, dim, n_vocab, INIT_EMBED, 0, 0);
    for (int l = 0; l < p->n_layers; l++) {
        /* only: -1 for every architecture, else the one that has it */
        struct { const char *what; int only; uint32_t type; uint64_t d0, d1;
                 init_kind init; float a, b; } ts[] = {
            {"attn_norm.weight", -1, LP_F32, dim, 0, INIT_UNIFORM, 0.5f, 1.5f},
            {"attn_q.weight", -1, wt, dim, q_dim, INIT_NORMAL, in_std, 0},
            {"attn_k.weight", -1, wt, dim, kv_dim, INIT_NORMAL, in_std, 0},
            {"attn_v.weight", -1, wt, dim, kv_dim, INIT_NORMAL, in_std, 0},
            {"attn_q.bias", LP_ARCH_QWEN2, LP_F32, q_dim, 0, INIT_NORMAL, 0.5f, 0},
            {"attn_k.bias", LP_ARCH_QWEN2, LP_F32, kv_dim, 0, INIT_NORMAL, 0.5f, 0},
            {"attn_v.bias", LP_ARCH_QWEN2, LP_F32, kv_dim, 0, INIT_NORMAL, 0.5f, 0},
            {"attn_q_norm.weight", LP_ARCH_QWEN3, LP_F32, head_dim, 0, INIT_UNIFORM, 0.5f, 1.5f},
            {"attn_k_norm.weight", LP_ARCH_QWEN3, LP_F32, head_dim, 0, INIT_UNIFORM, 0.5f, 1.5f},
            {"attn_output.weight", -1, wt, q_dim, dim, INIT_NORMAL,
             2.0f * depth / sqrtf((float)q_dim), 0},
            {"ffn_norm.weight", -1, LP_F32, dim, 0, INIT_UNIFORM, 0.5f, 1.5f},
            {"ffn_gate.weight", -1, wt, dim, ffn, INIT_NORMAL, in_std, 0},
            {"ffn_up.weight", -1, wt, dim, ffn, INIT_NORMAL, in_std, 0},
            {"ffn_down.weight", -1, wt, ffn, dim, INIT_NORMAL,
             2.0f * depth / sqrtf((float)ffn), 0},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (ts[i].only >= 0 && ts[i].only != (int)p->arch) continue;
            layer_name(name, sizeof name, l, ts[i].what);
            plan_add(pl, name, ts[i].type, ts[i].d0, ts[i].d1, ts[i].init, ts[i].a, ts[i].b);
        }
    }
    /* With a tied classifier the final state, which still contains the input
     * token's embedding, scores that token ~sqrt(dim) times above the rest,
     * so greedy decoding would just repeat it. Random signs on the output
     * norm make that self-score zero-mean. */
    const float out_gain = 32.0f / sqrtf((float)dim);
    plan_add(pl, "output_norm.weight", LP_F32, dim, 0,
             p->tied_output ? INIT_SIGNED : INIT_UNIFORM, 0.5f * out_gain, 1.5f * out_gain);
    if (!p->tied_output)
        plan_add(pl, "output.weight", p->embd_type, dim, n_vocab, INIT_EMBED, 0, 0);
}

/* ---- parallel generation -------------------------------------------------- */

/* Rows per RNG stream: depends only on the row length, never on threads. */
static uint64_t chunk_rows(uint64_t row_len) {
    const uint64_t target = 1u << 18;
    return row_len >= target ? 1 : target / row_len;
}

typedef struct gen_job { uint32_t tensor; uint64_t chunk; } gen_job;

typedef struct gen_ctx {
    const synth_tensor *tensors;
    const gen_job *jobs;
    size_t n_jobs;
    uint64_t seed;
    ziggurat zig;
    float **scratch;      /* per thread, max_chunk floats */
    atomic_size_t next_job;
    atomic_bool failed;
} gen_ctx;

static bool fill_chunk(const synth_tensor *t, uint64_t chunk, uint64_t seed,
                       const ziggurat *z, float *buf) {
    const uint64_t n = t->dims[0], per = chunk_rows(n);
    const uint64_t r0 = chunk * per;
    const uint64_t r1 = r0 + per < t->dims[1] ? r0 + per : t->dims[1];
    lp_rng rng;
    seed_stream(&rng, seed, t->name, chunk);
    for (uint64_t r = r0; r < r1; r++) {
        float *row = buf + (r - r0) * n;
        if (t->init == INIT_UNIFORM || t->init == INIT_SIGNED) {
            fill_uniform(&rng, row, n, t->a, t->b);
            for (uint64_t i = 0; t->init == INIT_SIGNED && i < n; i++)
                if (lp_rng_u64(&rng) >> 63) row[i] = -row[i];
        } else {
            fill_normal(z, &rng, row, n, t->init == INIT_EMBED ? 1.0f : t->a);
        }
        if (t->init == INIT_EMBED) {
            double ss = 0.0;
            for (uint64_t i = 0; i < n; i++) ss += (double)row[i] * row[i];
            float s = ss > 0.0 ? (float)sqrt((double)n / ss) : 1.0f;
            for (uint64_t i = 0; i < n; i++) row[i] *= s;
        }
        uint8_t *dst = (uint8_t *)t->data + r * t->row_bytes;
        if (!lp_quantize_row(t->type, row, dst, (int64_t)n)) return false;
    }
    return true;
}

static void gen_worker(void *vctx, int thread_index, int n_threads) {
    gen_ctx *c = vctx;
    float *buf = c->scratch[thread_index];
    for (;;) {
        size_t j = atomic_fetch_add_explicit(&c->next_job, 1, memory_order_relaxed);
        if (j >= c->n_jobs) break;
        const gen_job *job = &c->jobs[j];
        if (!fill_chunk(&c->tensors[job->tensor], job->chunk, c->seed, &c->zig, buf))
            atomic_store(&c->failed, true);
    }
}

/* Allocates and fills every tensor (except INIT_FIXED ones, which the caller
 * fills). */
static int generate_tensors(synth_tensor *ts, size_t n, uint64_t seed, lp_error *err) {
    size_t n_jobs = 0, max_chunk = 1;
    for (size_t i = 0; i < n; i++) {
        ts[i].data = lp_alloc(ts[i].n_bytes);
        if (!ts[i].data)
            return lp_fail(err, "synth: out of memory for %s (%zu bytes)", ts[i].name,
                           ts[i].n_bytes);
        if (ts[i].init == INIT_FIXED) continue;
        uint64_t per = chunk_rows(ts[i].dims[0]);
        n_jobs += (size_t)((ts[i].dims[1] + per - 1) / per);
        uint64_t elems = per * ts[i].dims[0];
        if (elems > max_chunk) max_chunk = (size_t)elems;
    }
    gen_job *jobs = calloc(n_jobs ? n_jobs : 1, sizeof *jobs);
    if (!jobs) return lp_fail(err, "synth: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ts[i].init == INIT_FIXED) continue;
        uint64_t per = chunk_rows(ts[i].dims[0]);
        for (uint64_t c = 0; c * per < ts[i].dims[1]; c++)
            jobs[k++] = (gen_job){(uint32_t)i, c};
    }

    int rc = 0;
    lp_threadpool *pool = lp_threadpool_create(lp_default_threads(), err);
    if (!pool) {
        free(jobs);
        return -1;
    }
    int n_threads = lp_threadpool_size(pool);
    gen_ctx ctx = {.tensors = ts, .jobs = jobs, .n_jobs = n_jobs, .seed = seed};
    ziggurat_init(&ctx.zig);
    atomic_init(&ctx.next_job, 0);
    atomic_init(&ctx.failed, false);
    ctx.scratch = calloc((size_t)n_threads, sizeof *ctx.scratch);
    bool alloc_ok = ctx.scratch != NULL;
    for (int t = 0; alloc_ok && t < n_threads; t++) {
        ctx.scratch[t] = malloc(max_chunk * sizeof(float));
        alloc_ok = ctx.scratch[t] != NULL;
    }
    if (!alloc_ok) {
        rc = lp_fail(err, "synth: out of memory for scratch buffers");
    } else {
        lp_threadpool_run(pool, gen_worker, &ctx);
        if (atomic_load(&ctx.failed))
            rc = lp_fail(err, "synth: the kernels could not quantize to a requested type");
    }
    for (int t = 0; ctx.scratch && t < n_threads; t++) free(ctx.scratch[t]);
    free(ctx.scratch);
    lp_threadpool_destroy(pool);
    free(jobs);
    return rc;
}

/* ---- metadata ------------------------------------------------------------ */

/* llama.cpp's llama_ftype for "mostly <type>". */
static uint32_t file_type_of(uint32_t weight_type) {
    switch (weight_type) {
    case LP_F32: return 0;
    case LP_F16: return 1;
    case LP_Q4_0: return 2;
    case LP_Q4_1: return 3;
    case LP_Q8_0: return 7;
    case LP_Q5_0: return 8;
    case LP_Q5_1: return 9;
    case LP_Q4_K: return 14; /* Q4_K_S */
    case LP_Q5_K: return 16; /* Q5_K_S */
    case LP_Q6_K: return 18;
    case LP_BF16: return 32;
    default: return 1;
    }
}

static void set_arch_u32(lp_gguf_writer *w, const char *arch, const char *key, uint32_t v) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    lp_gguf_writer_set_u32(w, full, v);
}

static void set_arch_f32(lp_gguf_writer *w, const char *arch, const char *key, float v) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    lp_gguf_writer_set_f32(w, full, v);
}

/* The built-in 259-token SentencePiece byte vocabulary. */
#define BUILTIN_VOCAB 259

typedef struct builtin_vocab {
    char bytes[256][8];   /* "<0xAB>" */
    lp_str tokens[BUILTIN_VOCAB];
    float scores[BUILTIN_VOCAB];
    int32_t types[BUILTIN_VOCAB];
} builtin_vocab;

static void write_builtin_vocab(lp_gguf_writer *w, builtin_vocab *v) {
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        v->tokens[i] = (lp_str){specials[i], strlen(specials[i])};
        v->types[i] = i == 0 ? 2 : 3;   /* UNKNOWN, CONTROL */
    }
    for (int b = 0; b < 256; b++) {
        snprintf(v->bytes[b], sizeof v->bytes[b], "<0x%02X>", b);
        v->tokens[3 + b] = (lp_str){v->bytes[b], 6};
        v->types[3 + b] = 6;            /* BYTE */
    }
    lp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    lp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    lp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, BUILTIN_VOCAB);
    lp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v->scores, BUILTIN_VOCAB);
    lp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->types, BUILTIN_VOCAB);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    lp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    lp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    lp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
}

/* Number of tokens in a vocabulary GGUF. */
static int vocab_size(const lp_gguf *vocab, uint64_t *n_vocab, lp_error *err) {
    const lp_gguf_kv *tokens = NULL;
    if (lp_gguf_get_arr(vocab, "tokenizer.ggml.tokens", LP_GGUF_STRING, &tokens, err) < 0)
        return -1;
    if (!tokens || tokens->arr_len == 0 || tokens->arr_len > (1u << 24))
        return lp_fail(err, "%s: no usable tokenizer.ggml.tokens array",
                       lp_gguf_path(vocab));
    *n_vocab = tokens->arr_len;
    return 0;
}

static void copy_tokenizer_keys(lp_gguf_writer *w, const lp_gguf *vocab) {
    for (size_t i = 0; i < lp_gguf_kv_count(vocab); i++) {
        const lp_gguf_kv *kv = lp_gguf_kv_at(vocab, i);
        if (kv->key.len >= 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0)
            lp_gguf_writer_copy_kv(w, kv);
    }
}

static void write_hparams(lp_gguf_writer *w, const lp_synth_params *p, uint64_t n_vocab) {
    const char *arch = lp_arch_name(p->arch);
    char desc[512];
    snprintf(desc, sizeof desc,
             "RANDOM weights (seed %llu; token_embd N(0,1) rows rescaled to norm "
             "sqrt(%d), q/k/v/gate/up N(0,1/fan_in), attn_output/ffn_down "
             "N(0,(2*%.4g/sqrt(fan_in))^2), norm weights U(0.5,1.5) (output_norm "
             "x%.4g%s)%s); test model for loraplex, not a trained model",
             (unsigned long long)p->seed, p->dim,
             sqrt(2.0 / (p->n_layers > 2 ? p->n_layers : 2)), 32.0 / sqrt(p->dim),
             p->tied_output ? ", random signs" : "", p->arch == LP_ARCH_QWEN2 ? ", biases N(0,0.25)" : "");
    lp_gguf_writer_set_str(w, "general.architecture", arch);
    lp_gguf_writer_set_str(w, "general.type", "model");
    lp_gguf_writer_set_str(w, "general.name", p->name ? p->name : arch);
    lp_gguf_writer_set_str(w, "general.description", desc);
    set_arch_u32(w, arch, "block_count", (uint32_t)p->n_layers);
    set_arch_u32(w, arch, "context_length", (uint32_t)p->n_ctx);
    set_arch_u32(w, arch, "embedding_length", (uint32_t)p->dim);
    set_arch_u32(w, arch, "feed_forward_length", (uint32_t)p->ffn_dim);
    set_arch_u32(w, arch, "attention.head_count", (uint32_t)p->n_heads);
    set_arch_u32(w, arch, "attention.head_count_kv", (uint32_t)p->n_kv_heads);
    set_arch_f32(w, arch, "rope.freq_base", p->rope_theta);
    set_arch_f32(w, arch, "attention.layer_norm_rms_epsilon", p->rms_eps);
    /* head_dim * n_heads may differ from dim (Qwen3), so always say it. */
    set_arch_u32(w, arch, "attention.key_length", (uint32_t)p->head_dim);
    set_arch_u32(w, arch, "attention.value_length", (uint32_t)p->head_dim);
    lp_gguf_writer_set_u32(w, "general.file_type", file_type_of(p->weight_type));
    set_arch_u32(w, arch, "vocab_size", (uint32_t)n_vocab);
    set_arch_u32(w, arch, "rope.dimension_count", (uint32_t)p->head_dim);
}

/* ---- lp_synth_write --------------------------------------------------------- */

int lp_synth_write(const lp_synth_params *p, const char *out_path, lp_error *err) {
    if (check_params(p, err) < 0) return -1;

    int rc = -1;
    lp_gguf *vocab = NULL;
    builtin_vocab *bv = NULL;
    tensor_plan plan = {0};
    lp_gguf_writer *w = lp_gguf_writer_create();
    if (!w) return lp_fail(err, "synth: out of memory");

    /* The vocabulary's size shapes the embedding and goes into the hparams,
     * which the converter writes before the tokenizer keys. */
    uint64_t n_vocab = BUILTIN_VOCAB;
    if (p->vocab_path) {
        vocab = lp_gguf_open(p->vocab_path, err);
        if (!vocab || vocab_size(vocab, &n_vocab, err) < 0) goto done;
    }
    write_hparams(w, p, n_vocab);
    if (vocab) {
        copy_tokenizer_keys(w, vocab);
    } else {
        bv = calloc(1, sizeof *bv);
        if (!bv) {
            lp_fail(err, "synth: out of memory");
            goto done;
        }
        write_builtin_vocab(w, bv);
    }
    lp_gguf_writer_set_u32(w, "general.quantization_version", 2);

    plan.cap = 4 + (size_t)p->n_layers * 16;
    plan.t = calloc(plan.cap, sizeof *plan.t);
    if (!plan.t) {
        lp_fail(err, "synth: out of memory");
        goto done;
    }
    plan_model(&plan, p, n_vocab);
    if (plan.overflow) {
        lp_fail(err, "synth: tensor sizes overflow");
        goto done;
    }
    if (generate_tensors(plan.t, plan.n, p->seed, err) < 0) goto done;
    for (size_t i = 0; i < plan.n; i++) {
        synth_tensor *t = &plan.t[i];
        if (t->init == INIT_FIXED) llama3_rope_factors(t->data, p->head_dim, p->rope_theta);
        lp_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->dims, t->data,
                                  t->n_bytes);
    }
    rc = lp_gguf_writer_write(w, out_path, err);

done:
    lp_gguf_writer_free(w);   /* before the buffers it references */
    for (size_t i = 0; plan.t && i < plan.n; i++) lp_free(plan.t[i].data);
    free(plan.t);
    free(bv);
    if (vocab) lp_gguf_close(vocab);
    return rc;
}

/* ---- LoRA adapters ------------------------------------------------------ */

/* llama.cpp tensor names of the projections an adapter may target, in the
 * order the adapter lists them per layer. */
static const struct { const char *short_name, *gguf_name; } lora_targets[] = {
    {"q", "attn_q"},      {"k", "attn_k"},      {"v", "attn_v"},
    {"o", "attn_output"}, {"gate", "ffn_gate"}, {"up", "ffn_up"},
    {"down", "ffn_down"},
};
#define N_LORA_TARGETS 7

/* "q,k,v" -> selected[]; accepts short names and llama.cpp names. */
static int parse_targets(const char *targets, bool selected[N_LORA_TARGETS],
                         lp_error *err) {
    memset(selected, 0, N_LORA_TARGETS * sizeof selected[0]);
    if (!targets) targets = "q,k,v,o,gate,up,down";
    const char *s = targets;
    int n = 0;
    while (*s) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        size_t len = strcspn(s, ", ");
        int found = -1;
        for (int i = 0; i < N_LORA_TARGETS; i++) {
            if ((strlen(lora_targets[i].short_name) == len &&
                 memcmp(s, lora_targets[i].short_name, len) == 0) ||
                (strlen(lora_targets[i].gguf_name) == len &&
                 memcmp(s, lora_targets[i].gguf_name, len) == 0))
                found = i;
        }
        if (found < 0)
            return lp_fail(err, "synth: unknown LoRA target '%.*s' in \"%s\" (use "
                           "q,k,v,o,gate,up,down)", (int)len, s, targets);
        selected[found] = true;
        n++;
        s += len;
    }
    if (n == 0) return lp_fail(err, "synth: no LoRA targets in \"%s\"", targets);
    return 0;
}

int lp_synth_lora_write(const char *base_model_path, int rank, float alpha,
                        const char *targets, uint64_t seed, const char *out_path,
                        lp_error *err) {
    bool selected[N_LORA_TARGETS];
    if (parse_targets(targets, selected, err) < 0) return -1;
    if (rank < 1 || rank > 65536)
        return lp_fail(err, "synth: LoRA rank %d out of range 1..65536", rank);
    if (!isfinite(alpha)) return lp_fail(err, "synth: LoRA alpha must be finite");

    lp_gguf *base = lp_gguf_open(base_model_path, err);
    if (!base) return -1;
    int rc = -1;
    lp_gguf_writer *w = NULL;
    float **bufs = NULL;
    size_t n_bufs = 0;

    lp_str arch = {0};
    int got = lp_gguf_get_str(base, "general.architecture", &arch, err);
    if (got < 0) goto done;
    if (got == 0) {
        lp_fail(err, "%s: no general.architecture", base_model_path);
        goto done;
    }
    char arch_c[64], key[128];
    if (arch.len == 0 || arch.len >= sizeof arch_c) {
        lp_fail(err, "%s: unusable general.architecture", base_model_path);
        goto done;
    }
    memcpy(arch_c, arch.ptr, arch.len);
    arch_c[arch.len] = '\0';
    snprintf(key, sizeof key, "%s.block_count", arch_c);
    uint32_t n_layers = 0;
    got = lp_gguf_get_u32(base, key, &n_layers, err);
    if (got < 0) goto done;
    if (got == 0 || n_layers == 0 || n_layers > 4096) {
        lp_fail(err, "%s: missing or invalid %s", base_model_path, key);
        goto done;
    }

    w = lp_gguf_writer_create();
    bufs = calloc((size_t)n_layers * N_LORA_TARGETS * 2, sizeof *bufs);
    if (!w || !bufs) {
        lp_fail(err, "synth: out of memory");
        goto done;
    }
    char name[96];
    snprintf(name, sizeof name, "random-lora-r%d", rank);
    lp_gguf_writer_set_str(w, "general.architecture", arch_c);
    lp_gguf_writer_set_str(w, "general.type", "adapter");
    lp_gguf_writer_set_str(w, "adapter.type", "lora");
    lp_gguf_writer_set_f32(w, "adapter.lora.alpha", alpha);
    lp_gguf_writer_set_str(w, "general.name", name);

    /* A ~ N(0, 1/in) maps x to rank-many O(1) values; B ~ N(0, 0.04/r) gives
     * B(Ax) entries of about 0.2: a visible change to an O(1) projection. */
    const float b_std = 0.2f / sqrtf((float)rank);
    ziggurat zig;
    ziggurat_init(&zig);
    for (uint32_t l = 0; l < n_layers; l++) {
        for (int ti = 0; ti < N_LORA_TARGETS; ti++) {
            if (!selected[ti]) continue;
            char wname[96];
            snprintf(wname, sizeof wname, "blk.%u.%s.weight", l, lora_targets[ti].gguf_name);
            const lp_gguf_tensor *t = lp_gguf_find_tensor(base, wname);
            if (!t || t->n_dims != 2) {
                lp_fail(err, "%s: %s %s", base_model_path, wname,
                        t ? "is not a matrix" : "not found");
                goto done;
            }
            const uint64_t in = t->dims[0], out = t->dims[1];
            const uint64_t dims_a[2] = {in, (uint64_t)rank}, dims_b[2] = {(uint64_t)rank, out};
            size_t n_a, n_b, bytes_a, bytes_b;
            if (!lp_mul_ok(in, (size_t)rank, &n_a) || !lp_mul_ok(out, (size_t)rank, &n_b) ||
                !lp_mul_ok(n_a, sizeof(float), &bytes_a) ||
                !lp_mul_ok(n_b, sizeof(float), &bytes_b)) {
                lp_fail(err, "%s: %s: adapter size overflows", base_model_path, wname);
                goto done;
            }
            float *a = lp_alloc(bytes_a), *b = lp_alloc(bytes_b);
            bufs[n_bufs++] = a;
            bufs[n_bufs++] = b;
            if (!a || !b) {
                lp_fail(err, "synth: out of memory for %s adapter", wname);
                goto done;
            }
            char an[128], bn[128];
            snprintf(an, sizeof an, "%s.lora_a", wname);
            snprintf(bn, sizeof bn, "%s.lora_b", wname);
            lp_rng rng;
            seed_stream(&rng, seed, an, 0);
            fill_normal(&zig, &rng, a, n_a, 1.0f / sqrtf((float)in));
            seed_stream(&rng, seed, bn, 0);
            fill_normal(&zig, &rng, b, n_b, b_std);
            lp_gguf_writer_add_tensor(w, an, LP_F32, 2, dims_a, a, bytes_a);
            lp_gguf_writer_add_tensor(w, bn, LP_F32, 2, dims_b, b, bytes_b);
        }
    }
    rc = lp_gguf_writer_write(w, out_path, err);

done:
    lp_gguf_writer_free(w);
    for (size_t i = 0; i < n_bufs; i++) lp_free(bufs[i]);
    free(bufs);
    lp_gguf_close(base);
    return rc;
}
