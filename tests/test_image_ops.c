/* The image model's ops (src/kernels/image_ops.c) against naive
 * double-precision references written here from the PyTorch definitions:
 * conv2d from [cout][cin][kh][kw] weights (so the repack is checked too),
 * GroupNorm, LayerNorm, the activations, GEGLU, nearest upsampling, and the
 * tiled streaming-softmax attention against a full softmax, causal or not,
 * on one thread and on a pool, and a low-rank adapter's shrink and expand
 * (linear and conv). Each at the reference and the detected kernel level. */
#include "check.h"
#include "kernels/image_ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill(lp_rng *r, float *x, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) x[i] = amp * (2.0f * lp_rng_uniform(r) - 1.0f);
}

static double max_rel(const float *a, const double *ref, int64_t n) {
    double m = 0, scale = 1e-6;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - ref[i]) / scale);
    return m;
}

/* ---- conv2d --------------------------------------------------------------------- */

/* PyTorch conv2d, NCHW semantics on our channels-last tensors, after
 * F.pad(x, (pad, pad + pad_after, pad, pad + pad_after)):
 * y[n][oy][ox][o] = b[o] + sum w[o][i][ky][kx] x[n][iy][ix][i]. */
static void conv_naive(const lp_conv2d_shape *s, const float *w_oihw, const float *bias, const float *x, double *y) {
    int oh = (s->h + 2 * s->pad + s->pad_after - s->kh) / s->stride + 1;
    int ow = (s->w + 2 * s->pad + s->pad_after - s->kw) / s->stride + 1;
    CHECK(oh == lp_conv2d_out_h(s) && ow == lp_conv2d_out_w(s));
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int o = 0; o < s->cout; o++) {
                    double acc = bias ? bias[o] : 0.0;
                    for (int i = 0; i < s->cin; i++)
                        for (int ky = 0; ky < s->kh; ky++)
                            for (int kx = 0; kx < s->kw; kx++) {
                                int iy = oy * s->stride + ky - s->pad, ix = ox * s->stride + kx - s->pad;
                                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                                acc += (double)w_oihw[((o * s->cin + i) * s->kh + ky) * s->kw + kx] *
                                       x[(((int64_t)n * s->h + iy) * s->w + ix) * s->cin + i];
                            }
                    y[(((int64_t)n * oh + oy) * ow + ox) * s->cout + o] = acc;
                }
}

static void test_conv_case(const lp_kernels *k, lp_threadpool *pool, lp_conv2d_shape s, bool with_bias,
                           bool f16) {
    lp_rng r;
    lp_rng_seed(&r, 7u + (uint64_t)s.kh * 31u + (uint64_t)s.stride);
    CHECK(lp_conv2d_shape_ok(&s));
    int64_t K = (int64_t)s.kh * s.kw * s.cin, oh = lp_conv2d_out_h(&s), ow = lp_conv2d_out_w(&s);
    int64_t nx = (int64_t)s.n * s.h * s.w * s.cin, ny = (int64_t)s.n * oh * ow * s.cout;
    float *w = malloc(sizeof(float) * (size_t)(s.cout * K)), *wr = malloc(sizeof(float) * (size_t)(s.cout * K));
    float *b = malloc(sizeof(float) * (size_t)s.cout), *x = malloc(sizeof(float) * (size_t)nx);
    float *y = malloc(sizeof(float) * (size_t)ny);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    size_t sf = lp_conv2d_scratch_floats(&s);
    float *scratch = sf ? malloc(sizeof(float) * sf) : NULL;
    uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)(s.cout * K));
    fill(&r, w, s.cout * K, 0.5f);
    fill(&r, b, s.cout, 1.0f);
    fill(&r, x, nx, 1.0f);
    if (f16) /* the reference sees the values the f16 weight holds */
        for (int64_t i = 0; i < s.cout * K; i++) w[i] = lp_f16_to_f32(lp_f32_to_f16(w[i]));
    lp_conv_weight_repack(w, s.cout, s.cin, s.kh, s.kw, wr);
    lp_weight W = {.type = LP_F32, .rows = s.cout, .cols = K, .row_bytes = (size_t)K * 4, .data = wr};
    if (f16) {
        for (int64_t i = 0; i < s.cout * K; i++) wh[i] = lp_f32_to_f16(wr[i]);
        W = (lp_weight){.type = LP_F16, .rows = s.cout, .cols = K, .row_bytes = (size_t)K * 2, .data = wh};
    }
    conv_naive(&s, w, with_bias ? b : NULL, x, ref);
    lp_conv2d(k, pool, &s, &W, with_bias ? b : NULL, x, y, scratch);
    double e = max_rel(y, ref, ny);
    CHECK_MSG(e < 2e-5, "conv %dx%d s%d p%d cin %d cout %d %dx%d n%d%s: rel err %g", s.kh, s.kw, s.stride, s.pad,
              s.cin, s.cout, s.h, s.w, s.n, f16 ? " f16" : "", e);
    free(w), free(wr), free(b), free(x), free(y), free(ref), free(scratch), free(wh);
}

static void test_conv(const lp_kernels *k, lp_threadpool *pool) {
    /* 3x3 same padding (the UNet's and VAE's convs) */
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 2, .h = 7, .w = 5, .cin = 6, .cout = 9, .kh = 3, .kw = 3,
                                              .stride = 1, .pad = 1}, true, false);
    /* 3x3 stride 2 (the downsamplers) with an odd size */
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 1, .h = 9, .w = 6, .cin = 5, .cout = 8, .kh = 3, .kw = 3,
                                              .stride = 2, .pad = 1}, true, false);
    /* unpadded 3x3 */
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 1, .h = 6, .w = 6, .cin = 3, .cout = 4, .kh = 3, .kw = 3,
                                              .stride = 2, .pad = 0}, false, false);
    /* the VAE encoder's downsample: zeros after the end only (8x6 -> 4x3), and both kinds */
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 2, .h = 8, .w = 6, .cin = 3, .cout = 5, .kh = 3, .kw = 3,
                                              .stride = 2, .pad = 0, .pad_after = 1}, true, false);
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 1, .h = 5, .w = 7, .cin = 4, .cout = 3, .kh = 5, .kw = 5,
                                              .stride = 1, .pad = 1, .pad_after = 2}, true, false);
    /* 1x1 (proj_in / proj_out, the skip shortcuts) */
    test_conv_case(k, pool, (lp_conv2d_shape){.n = 2, .h = 4, .w = 3, .cin = 16, .cout = 12, .kh = 1, .kw = 1,
                                              .stride = 1, .pad = 0}, true, false);
    /* more output pixels than one tile, and f16 weights */
    lp_conv2d_shape big = {.n = 1, .h = 24, .w = 20, .cin = 8, .cout = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1};
    CHECK(lp_conv2d_tile_pixels(&big) < (int64_t)big.h * big.w);
    test_conv_case(k, pool, big, true, false);
    test_conv_case(k, pool, big, true, true);

    CHECK(!lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 2, .w = 2, .cin = 1, .cout = 1, .kh = 3, .kw = 3,
                                                 .stride = 1, .pad = 0}));
    CHECK(!lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 4, .w = 4, .cin = 1, .cout = 1, .kh = 3, .kw = 3,
                                                 .stride = 0, .pad = 1}));
    CHECK(!lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 4, .w = 4, .cin = 1, .cout = 1, .kh = 1, .kw = 1,
                                                 .stride = 1, .pad = 1}));
    CHECK(!lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 4, .w = 4, .cin = 1, .cout = 1, .kh = 3, .kw = 3,
                                                 .stride = 2, .pad = 1, .pad_after = 2}));
    CHECK(!lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 4, .w = 4, .cin = 1, .cout = 1, .kh = 3, .kw = 3,
                                                 .stride = 2, .pad = 0, .pad_after = -1}));
    CHECK(lp_conv2d_shape_ok(&(lp_conv2d_shape){.n = 1, .h = 4, .w = 4, .cin = 1, .cout = 1, .kh = 3, .kw = 3,
                                                .stride = 2, .pad = 0, .pad_after = 1}));
}

/* ---- norms ------------------------------------------------------------------------- */

/* GroupNorm of npix pixels x c channels in groups against the naive double
 * one; on the pool (and in place), the same bits as on one thread. */
static void test_group_norm_case(lp_threadpool *pool, int64_t npix, int64_t c, int groups) {
    lp_rng r;
    lp_rng_seed(&r, (uint64_t)(npix * 7 + c));
    int64_t n = npix * c, cg = c / groups;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    float *y1 = malloc(sizeof(float) * (size_t)n), *gamma = malloc(sizeof(float) * (size_t)c);
    float *beta = malloc(sizeof(float) * (size_t)c);
    double *ref = malloc(sizeof(double) * (size_t)n);
    double *scratch = malloc(sizeof(double) * lp_group_norm_scratch_doubles(groups));
    fill(&r, x, n, 3.0f);
    for (int64_t i = 0; i < n; i++) x[i] += 5.0f; /* an offset: the two-pass variance matters */
    fill(&r, gamma, c, 1.0f);
    fill(&r, beta, c, 1.0f);
    for (int silu = 0; silu < 2; silu++) {
        for (int g = 0; g < groups; g++) {
            double sum = 0, ss = 0;
            for (int64_t p = 0; p < npix; p++)
                for (int64_t i = 0; i < cg; i++) sum += x[p * c + g * cg + i];
            double mean = sum / (double)(npix * cg);
            for (int64_t p = 0; p < npix; p++)
                for (int64_t i = 0; i < cg; i++) ss += pow(x[p * c + g * cg + i] - mean, 2);
            double inv = 1.0 / sqrt(ss / (double)(npix * cg) + 1e-5);
            for (int64_t p = 0; p < npix; p++)
                for (int64_t i = 0; i < cg; i++) {
                    int64_t ch = g * cg + i;
                    double v = (x[p * c + ch] - mean) * inv * gamma[ch] + beta[ch];
                    ref[p * c + ch] = silu ? v / (1.0 + exp(-v)) : v;
                }
        }
        lp_group_norm(NULL, x, y1, npix, c, groups, gamma, beta, 1e-5f, silu, scratch);
        CHECK_MSG(max_rel(y1, ref, n) < 1e-5, "group norm %lld x %lld / %d%s: %g", (long long)npix, (long long)c,
                  groups, silu ? " +silu" : "", max_rel(y1, ref, n));
        memcpy(y, x, sizeof(float) * (size_t)n); /* in place, on the pool */
        lp_group_norm(pool, y, y, npix, c, groups, gamma, beta, 1e-5f, silu, scratch);
        CHECK_MSG(memcmp(y, y1, sizeof(float) * (size_t)n) == 0, "group norm %lld x %lld: threads change the bits",
                  (long long)npix, (long long)c);
    }
    free(x), free(y), free(y1), free(gamma), free(beta), free(ref), free(scratch);
}

static void test_norms(lp_threadpool *pool) {
    test_group_norm_case(pool, 13, 64, 32);     /* fewer pixels than runs */
    test_group_norm_case(pool, 1000, 320, 32);  /* two channel blocks, ragged runs, on the pool */
    test_group_norm_case(pool, 4096, 128, 32);  /* the VAE's shape */
    test_group_norm_case(pool, 300, 96, 3);     /* wide groups */
    lp_rng r;
    lp_rng_seed(&r, 11);
    enum { ROWS = 5, N = 48 };
    float lx[ROWS * N], ly[ROWS * N], gamma[N], beta[N];
    double lref[ROWS * N];
    fill(&r, gamma, N, 1.0f);
    fill(&r, beta, N, 1.0f);
    fill(&r, lx, ROWS * N, 2.0f);
    for (int i = 0; i < ROWS * N; i++) lx[i] -= 4.0f;
    for (int row = 0; row < ROWS; row++) {
        double sum = 0, ss = 0;
        for (int i = 0; i < N; i++) sum += lx[row * N + i];
        double mean = sum / N;
        for (int i = 0; i < N; i++) ss += pow(lx[row * N + i] - mean, 2);
        for (int i = 0; i < N; i++)
            lref[row * N + i] = (lx[row * N + i] - mean) / sqrt(ss / N + 1e-5) * gamma[i] + beta[i];
    }
    lp_layer_norm(ly, lx, ROWS, N, gamma, beta, 1e-5f);
    CHECK_MSG(max_rel(ly, lref, ROWS * N) < 1e-5, "layer norm: %g", max_rel(ly, lref, ROWS * N));
}

/* ---- activations ---------------------------------------------------------------------- */

static void test_activations(void) {
    enum { N = 201 };
    float x[N], a[N];
    double ref[N];
    for (int i = 0; i < N; i++) x[i] = -10.0f + 0.1f * (float)i;
    memcpy(a, x, sizeof a);
    lp_silu(a, N);
    for (int i = 0; i < N; i++) ref[i] = x[i] / (1.0 + exp(-(double)x[i]));
    CHECK_MSG(max_rel(a, ref, N) < 1e-6, "silu %g", max_rel(a, ref, N));
    memcpy(a, x, sizeof a);
    lp_quick_gelu(a, N);
    for (int i = 0; i < N; i++) ref[i] = x[i] / (1.0 + exp(-1.702 * x[i]));
    CHECK_MSG(max_rel(a, ref, N) < 1e-6, "quick_gelu %g", max_rel(a, ref, N));
    memcpy(a, x, sizeof a);
    lp_gelu(a, N);
    for (int i = 0; i < N; i++) ref[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
    CHECK_MSG(max_rel(a, ref, N) < 1e-6, "gelu %g", max_rel(a, ref, N));
    CHECK(fabsf(a[100]) < 1e-6f); /* gelu(0) = 0 */

    /* GEGLU: rows of [value | gate], also in place */
    enum { ROWS = 3, D = 10 };
    float g[ROWS * 2 * D], o[ROWS * D];
    double gref[ROWS * D];
    lp_rng r;
    lp_rng_seed(&r, 3);
    fill(&r, g, ROWS * 2 * D, 3.0f);
    for (int row = 0; row < ROWS; row++)
        for (int i = 0; i < D; i++) {
            double v = g[row * 2 * D + i], gate = g[row * 2 * D + D + i];
            gref[row * D + i] = v * 0.5 * gate * (1.0 + erf(gate / sqrt(2.0)));
        }
    lp_geglu(o, D, g, ROWS, D);
    CHECK_MSG(max_rel(o, gref, ROWS * D) < 1e-6, "geglu %g", max_rel(o, gref, ROWS * D));
    lp_geglu(g, D, g, ROWS, D);
    CHECK(max_rel(g, gref, ROWS * D) < 1e-6);
}

static void test_upsample(void) {
    enum { H = 3, W = 4, C = 5 };
    float x[H * W * C], y[4 * H * W * C];
    for (int i = 0; i < H * W * C; i++) x[i] = (float)i;
    lp_upsample_nearest2x(x, y, H, W, C);
    int bad = 0;
    for (int yy = 0; yy < 2 * H; yy++)
        for (int xx = 0; xx < 2 * W; xx++)
            for (int c = 0; c < C; c++)
                if (y[(yy * 2 * W + xx) * C + c] != x[((yy / 2) * W + xx / 2) * C + c]) bad++;
    CHECK(bad == 0);
    CHECK(y[((2 * H - 1) * 2 * W + 2 * W - 1) * C + C - 1] == x[H * W * C - 1]);
}

/* ---- attention -------------------------------------------------------------------------- */

static void attn_naive(const lp_attn_shape *s, const float *q, const float *k, const float *v, double *out) {
    double *p = malloc(sizeof(double) * (size_t)s->nk);
    for (int h = 0; h < s->heads; h++)
        for (int64_t i = 0; i < s->nq; i++) {
            int64_t nk = s->causal ? i + 1 : s->nk;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < nk; j++) {
                double d = 0;
                for (int64_t c = 0; c < s->d; c++)
                    d += (double)q[i * s->q_stride + h * s->d + c] * k[j * s->k_stride + h * s->d + c];
                p[j] = d * s->scale;
                m = fmax(m, p[j]);
            }
            for (int64_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - m));
            for (int64_t c = 0; c < s->d; c++) {
                double acc = 0;
                for (int64_t j = 0; j < nk; j++) acc += p[j] * v[j * s->v_stride + h * s->d + c];
                out[i * s->out_stride + h * s->d + c] = acc / sum;
            }
        }
    free(p);
}

static void test_attention_case(const lp_kernels *k, lp_threadpool *pool, int64_t nq, int64_t nk, int heads,
                                int64_t d, bool causal, float amp) {
    lp_rng r;
    lp_rng_seed(&r, (uint64_t)(nq * 131 + nk));
    int64_t w = heads * d;
    /* q, k, v interleaved in one buffer per row (as a fused qkv matmul writes them) */
    int64_t stride = 3 * w;
    int64_t rows = nq > nk ? nq : nk;
    float *qkv = malloc(sizeof(float) * (size_t)(rows * stride));
    float *out = malloc(sizeof(float) * (size_t)(nq * w));
    double *ref = malloc(sizeof(double) * (size_t)(nq * w));
    fill(&r, qkv, rows * stride, amp);
    lp_attn_shape s = {.nq = nq, .nk = nk, .heads = heads, .d = d, .q_stride = stride, .k_stride = stride,
                       .v_stride = stride, .out_stride = w, .scale = 1.0f / sqrtf((float)d), .causal = causal};
    int nt = pool ? lp_threadpool_size(pool) : 1;
    float *scratch = malloc(sizeof(float) * lp_attention_scratch_floats(nt, d));
    attn_naive(&s, qkv, qkv + w, qkv + 2 * w, ref);
    lp_attention_tiled(k, pool, &s, qkv, qkv + w, qkv + 2 * w, out, scratch);
    double e = max_rel(out, ref, nq * w);
    CHECK_MSG(e < 1e-5, "attention nq %lld nk %lld heads %d d %lld%s amp %g: rel err %g", (long long)nq,
              (long long)nk, heads, (long long)d, causal ? " causal" : "", (double)amp, e);
    free(qkv), free(out), free(ref), free(scratch);
}

static void test_attention(const lp_kernels *k, lp_threadpool *pool) {
    test_attention_case(k, pool, 5, 3, 1, 8, false, 1.0f);      /* fewer keys than a tile */
    test_attention_case(k, pool, 37, 150, 2, 16, false, 1.0f);  /* several key tiles, ragged query tile */
    test_attention_case(k, pool, 150, 150, 3, 8, false, 4.0f);  /* large scores: the running max must rescale */
    test_attention_case(k, pool, 77, 77, 2, 16, true, 2.0f);    /* CLIP's causal 77 tokens */
    test_attention_case(k, pool, 130, 130, 1, 4, true, 3.0f);   /* causal over several key tiles */
    /* SD's head widths (40: five value tiles of 8; 80) over ragged query
     * blocks of 32 and key tiles of 8 and 64; a causal block boundary */
    test_attention_case(k, pool, 100, 77, 2, 40, false, 2.0f);
    test_attention_case(k, pool, 33, 133, 1, 80, false, 3.0f);
    test_attention_case(k, pool, 70, 70, 2, 12, true, 2.0f);
}

/* ---- low-rank adapter passes ----------------------------------------------------- */

/* t = scale * conv(x, down) with down [r][kh][kw][cin] as in the file (the
 * kernels take it transposed), then y = y0 + t up^T with up [out][r]. */
static void lowrank_naive(const lp_conv2d_shape *s, const float *down, int32_t r, float scale, const float *x,
                          const float *up, int64_t out, const float *y0, double *y) {
    int64_t oh = lp_conv2d_out_h(s), ow = lp_conv2d_out_w(s), kc = (int64_t)s->kh * s->kw * s->cin;
    for (int64_t q = 0; q < s->n * oh * ow; q++) {
        int64_t img = q / (oh * ow), oy = q % (oh * ow) / ow, ox = q % ow;
        double t[80] = {0};
        for (int32_t j = 0; j < r; j++) {
            for (int64_t ky = 0; ky < s->kh; ky++)
                for (int64_t kx = 0; kx < s->kw; kx++) {
                    int64_t iy = oy * s->stride + ky - s->pad, ix = ox * s->stride + kx - s->pad;
                    if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                    for (int64_t c = 0; c < s->cin; c++)
                        t[j] += (double)down[j * kc + (ky * s->kw + kx) * s->cin + c] *
                                x[((img * s->h + iy) * s->w + ix) * s->cin + c];
                }
            t[j] *= scale;
        }
        for (int64_t o = 0; o < out; o++) {
            double v = y0[q * out + o];
            for (int32_t j = 0; j < r; j++) v += t[j] * up[o * r + j];
            y[q * out + o] = v;
        }
    }
}

/* Both passes at every level, on one thread and a pool: within float
 * rounding of the naive sums, and the reference level's bits everywhere. */
static void test_lowrank_case(const lp_kernels *levels, int n_levels, lp_threadpool *pool, lp_conv2d_shape s,
                              int32_t r, int64_t out) {
    lp_rng rng;
    lp_rng_seed(&rng, (uint64_t)(r * 131 + out + s.kh * 7 + s.stride));
    int64_t kc = (int64_t)s.kh * s.kw * s.cin, px = (int64_t)s.n * lp_conv2d_out_h(&s) * lp_conv2d_out_w(&s);
    int64_t nx = (int64_t)s.n * s.h * s.w * s.cin;
    float *x = malloc(sizeof(float) * nx), *down = malloc(sizeof(float) * r * kc), *dt = malloc(sizeof(float) * r * kc);
    float *up = malloc(sizeof(float) * r * out), *ut = malloc(sizeof(float) * r * out);
    float *y0 = malloc(sizeof(float) * px * out), *t = malloc(sizeof(float) * px * r);
    float *y = malloc(sizeof(float) * px * out), *first = malloc(sizeof(float) * px * out);
    double *ref = malloc(sizeof(double) * px * out);
    fill(&rng, x, nx, 1.0f), fill(&rng, down, r * kc, 0.5f), fill(&rng, up, r * out, 0.5f), fill(&rng, y0, px * out, 2.0f);
    for (int64_t j = 0; j < r; j++)
        for (int64_t c = 0; c < kc; c++) dt[c * r + j] = down[j * kc + c];
    for (int64_t o = 0; o < out; o++)
        for (int64_t j = 0; j < r; j++) ut[j * out + o] = up[o * r + j];
    float scale = 0.75f;
    lowrank_naive(&s, down, r, scale, x, up, out, y0, ref);
    for (int l = 0; l < n_levels; l++)
        for (int p = 0; p < 2; p++) {
            memcpy(y, y0, sizeof(float) * px * out);
            lp_lowrank_down(&levels[l], p ? pool : NULL, &s, dt, r, scale, x, t);
            lp_lowrank_up(&levels[l], p ? pool : NULL, px, r, t, ut, out, y, out);
            double e = max_rel(y, ref, px * out);
            CHECK_MSG(e < 1e-5, "lowrank k%d s%d r%d out %lld level %d: rel err %g", s.kh, s.stride, r, (long long)out,
                      l, e);
            if (l == 0 && p == 0) memcpy(first, y, sizeof(float) * px * out);
            else CHECK_MSG(!memcmp(first, y, sizeof(float) * px * out), "lowrank k%d s%d r%d out %lld level %d pool %d: not the reference's bits",
                           s.kh, s.stride, r, (long long)out, l, p);
        }
    free(x), free(down), free(dt), free(up), free(ut), free(y0), free(t), free(y), free(first), free(ref);
}

static void test_lowrank(const lp_kernels *levels, int n_levels, lp_threadpool *pool) {
    /* a linear over 37 rows (ragged pixel and row blocks), ranks around the
     * 16-lane and 32-column blocks, outputs with a 64-wide tail */
    static const int32_t ranks[] = {1, 4, 16, 17, 32, 40, 80};
    for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++)
        test_lowrank_case(levels, n_levels, pool, (lp_conv2d_shape){.n = 1, .h = 1, .w = 37, .cin = 24, .kh = 1, .kw = 1, .stride = 1},
                          ranks[i], 70);
    /* LoCon's 3x3 shrink: padded (border taps skipped), strided, two images */
    test_lowrank_case(levels, n_levels, pool, (lp_conv2d_shape){.n = 2, .h = 7, .w = 5, .cin = 6, .kh = 3, .kw = 3, .stride = 1, .pad = 1},
                      8, 19);
    test_lowrank_case(levels, n_levels, pool, (lp_conv2d_shape){.n = 1, .h = 9, .w = 6, .cin = 5, .kh = 3, .kw = 3, .stride = 2, .pad = 1},
                      33, 130);
    test_lowrank_case(levels, n_levels, pool, (lp_conv2d_shape){.n = 1, .h = 6, .w = 6, .cin = 3, .kh = 3, .kw = 3, .stride = 1},
                      4, 5);
    test_lowrank_case(levels, n_levels, pool,
                      (lp_conv2d_shape){.n = 2, .h = 8, .w = 6, .cin = 5, .kh = 3, .kw = 3, .stride = 2, .pad_after = 1}, 12, 20);
    /* padded, with more channels than the SIMD paths' zero row: the reference runs it */
    test_lowrank_case(levels, n_levels, pool,
                      (lp_conv2d_shape){.n = 1, .h = 3, .w = 2, .cin = 4100, .kh = 3, .kw = 3, .stride = 1, .pad = 1}, 3, 5);
}

int main(void) {
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels levels[3];
    int n_levels = 2;
    lp_kernels_init_reference(&levels[0]);
    lp_kernels_init(&levels[1], &cpu);
#if defined(__x86_64__)
    lp_kernels_init_capped(&levels[n_levels++], &cpu, LP_CPU_CAP_AVX2); /* the AVX2 paths on any x86 */
#endif
    lp_error err = {0};
    lp_threadpool *pool = lp_threadpool_create(3, &err);
    CHECK(pool != NULL);
    for (int l = 0; l < n_levels; l++) {
        test_conv(&levels[l], NULL);
        test_conv(&levels[l], pool);
        test_attention(&levels[l], NULL);
        test_attention(&levels[l], pool);
    }
    test_lowrank(levels, n_levels, pool);
    test_norms(pool);
    test_activations();
    test_upsample();
    lp_threadpool_destroy(pool);
    for (int l = 0; l < n_levels; l++) lp_kernels_free(&levels[l]);
    return check_summary("test_image_ops");
}
