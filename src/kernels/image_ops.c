/* The ops of an image model, channels last (see image_ops.h). Plain C: the
 * heavy part of a convolution is lp_matmul's, which has the SIMD paths;
 * attention is in attention.c, the adapters' passes in lowrank.c. */
#include "image_ops.h"

#include <math.h>
#include <string.h>

/* ---- convolution ------------------------------------------------------------- */

int32_t lp_conv2d_out_h(const lp_conv2d_shape *s) {
    return s->stride > 0 ? (s->h + 2 * s->pad + s->pad_after - s->kh) / s->stride + 1 : 0;
}

int32_t lp_conv2d_out_w(const lp_conv2d_shape *s) {
    return s->stride > 0 ? (s->w + 2 * s->pad + s->pad_after - s->kw) / s->stride + 1 : 0;
}

bool lp_conv2d_shape_ok(const lp_conv2d_shape *s) {
    if (s->n <= 0 || s->h <= 0 || s->w <= 0 || s->cin <= 0 || s->cout <= 0 || s->kh <= 0 || s->kw <= 0 ||
        s->stride <= 0 || s->pad < 0 || s->pad_after < 0 || s->pad + s->pad_after >= s->kh ||
        s->pad + s->pad_after >= s->kw)
        return false;
    int64_t extra = 2 * (int64_t)s->pad + s->pad_after;
    if ((int64_t)s->h + extra < s->kh || (int64_t)s->w + extra < s->kw) return false;
    size_t px, k, t;
    return lp_mul_ok((size_t)s->h, (size_t)s->w, &px) && lp_mul_ok(px, (size_t)s->n, &t) &&
           lp_mul_ok(t, (size_t)(s->cin > s->cout ? s->cin : s->cout), &t) &&
           lp_mul_ok((size_t)s->kh * (size_t)s->kw, (size_t)s->cin, &k) && t < ((size_t)1 << 60);
}

static bool conv_is_pointwise(const lp_conv2d_shape *s) {
    return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad == 0 && s->pad_after == 0;
}

int64_t lp_conv2d_tile_pixels(const lp_conv2d_shape *s) {
    int64_t k = (int64_t)s->kh * s->kw * s->cin;
    int64_t t = ((int64_t)2 << 20) / (4 * k);
    if (t > 256) t = 256;
    t &= ~(int64_t)15;
    if (t < 16) t = 16;
    int64_t out = (int64_t)lp_conv2d_out_h(s) * lp_conv2d_out_w(s);
    return t < out ? t : out;
}

size_t lp_conv2d_scratch_floats(const lp_conv2d_shape *s) {
    if (conv_is_pointwise(s)) return 0;
    return (size_t)lp_conv2d_tile_pixels(s) * (size_t)s->kh * (size_t)s->kw * (size_t)s->cin;
}

/* Gathers output pixels [p0, p0 + np) of one image into panel rows of
 * kh*kw*cin floats, (ky, kx, ci) order, zeros where the patch leaves the
 * input. */
static void conv_gather(const lp_conv2d_shape *s, const float *img, int64_t p0, int64_t np, float *panel) {
    int32_t ow = lp_conv2d_out_w(s);
    int64_t krow = (int64_t)s->kh * s->kw * s->cin;
    size_t cbytes = (size_t)s->cin * sizeof(float);
    for (int64_t t = 0; t < np; t++) {
        int64_t p = p0 + t;
        int64_t oy = p / ow, ox = p % ow;
        float *row = panel + t * krow;
        for (int32_t ky = 0; ky < s->kh; ky++) {
            int64_t iy = oy * s->stride + ky - s->pad;
            for (int32_t kx = 0; kx < s->kw; kx++) {
                int64_t ix = ox * s->stride + kx - s->pad;
                float *dst = row + ((int64_t)ky * s->kw + kx) * s->cin;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
                    memset(dst, 0, cbytes);
                else
                    memcpy(dst, img + (iy * s->w + ix) * s->cin, cbytes);
            }
        }
    }
}

static void add_bias(float *y, int64_t rows, int64_t c, const float *bias) {
    if (!bias) return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < c; i++) y[r * c + i] += bias[i];
}

void lp_conv2d(const lp_kernels *k, lp_threadpool *pool, const lp_conv2d_shape *s, const lp_weight *W,
               const float *bias, const float *x, float *y, float *scratch) {
    int64_t in_px = (int64_t)s->h * s->w, out_px = (int64_t)lp_conv2d_out_h(s) * lp_conv2d_out_w(s);
    if (conv_is_pointwise(s)) {
        int64_t rows = in_px * s->n;
        lp_matmul(k, pool, W, x, s->cin, rows, y, s->cout);
        add_bias(y, rows, s->cout, bias);
        return;
    }
    int64_t tile = lp_conv2d_tile_pixels(s), krow = (int64_t)s->kh * s->kw * s->cin;
    for (int32_t n = 0; n < s->n; n++) {
        const float *img = x + (int64_t)n * in_px * s->cin;
        float *out = y + (int64_t)n * out_px * s->cout;
        for (int64_t p0 = 0; p0 < out_px; p0 += tile) {
            int64_t np = out_px - p0 < tile ? out_px - p0 : tile;
            conv_gather(s, img, p0, np, scratch);
            lp_matmul(k, pool, W, scratch, krow, np, out + p0 * s->cout, s->cout);
        }
        add_bias(out, out_px, s->cout, bias);
    }
}

void lp_conv_weight_repack(const float *src, int64_t cout, int64_t cin, int64_t kh, int64_t kw, float *dst) {
    for (int64_t o = 0; o < cout; o++)
        for (int64_t i = 0; i < cin; i++)
            for (int64_t y = 0; y < kh; y++)
                for (int64_t x = 0; x < kw; x++)
                    dst[((o * kh + y) * kw + x) * cin + i] = src[((o * cin + i) * kh + y) * kw + x];
}

/* ---- normalisation ------------------------------------------------------------- */

static float silu1(float v) { return v / (1.0f + expf(-v)); }

/* Statistics in LP_GN_RUNS runs of pixels fixed by npix alone, each summed
 * into its own partials and the partials added in run order, so the result
 * does not depend on the thread count. */
size_t lp_group_norm_scratch_doubles(int groups) { return (size_t)(2 * LP_GN_RUNS + 2) * (size_t)groups; }

typedef struct gn_job {
    const float *x;
    float *y;
    int64_t npix, c, cg, run_px; /* pixels per run */
    int groups;
    const float *gamma, *beta;
    bool silu;
    double *sum, *ss;        /* [LP_GN_RUNS][groups] */
    const double *mean, *inv; /* [groups], once the pass that needs them runs */
    int pass;                 /* 0: sums, 1: squared deviations, 2: normalise */
} gn_job;

#define GN_BLOCK 256 /* channels per accumulator block */

/* Run r's partials: per channel in double over the run's pixels (a block of
 * channels at a time, contiguous, so it vectorises), then per group. */
static void gn_stats(const gn_job *j, int64_t r) {
    int64_t p0 = r * j->run_px, p1 = p0 + j->run_px < j->npix ? p0 + j->run_px : j->npix;
    double *out = (j->pass == 0 ? j->sum : j->ss) + r * j->groups;
    for (int g = 0; g < j->groups; g++) out[g] = 0;
    for (int64_t c0 = 0; c0 < j->c; c0 += GN_BLOCK) {
        int64_t nc = j->c - c0 < GN_BLOCK ? j->c - c0 : GN_BLOCK;
        double acc[GN_BLOCK], m[GN_BLOCK];
        for (int64_t i = 0; i < nc; i++) {
            acc[i] = 0;
            m[i] = j->pass == 0 ? 0.0 : j->mean[(c0 + i) / j->cg];
        }
        for (int64_t p = p0; p < p1; p++) {
            const float *xp = j->x + p * j->c + c0;
            if (j->pass == 0)
                for (int64_t i = 0; i < nc; i++) acc[i] += xp[i];
            else
                for (int64_t i = 0; i < nc; i++) acc[i] += (xp[i] - m[i]) * (xp[i] - m[i]);
        }
        for (int64_t i = 0; i < nc; i++) out[(c0 + i) / j->cg] += acc[i];
    }
}

static void gn_normalise(const gn_job *j, int64_t r) {
    int64_t p0 = r * j->run_px, p1 = p0 + j->run_px < j->npix ? p0 + j->run_px : j->npix;
    for (int64_t p = p0; p < p1; p++) {
        const float *xp = j->x + p * j->c;
        float *yp = j->y + p * j->c;
        for (int g = 0; g < j->groups; g++) {
            float m = (float)j->mean[g], inv = (float)j->inv[g];
            for (int64_t i = g * j->cg; i < (g + 1) * j->cg; i++) {
                float v = (xp[i] - m) * inv * j->gamma[i] + j->beta[i];
                yp[i] = j->silu ? silu1(v) : v;
            }
        }
    }
}

static void gn_worker(void *ctx, int ti, int nt) {
    const gn_job *j = ctx;
    int64_t runs = (j->npix + j->run_px - 1) / j->run_px, begin, end;
    lp_split_range(runs, ti, nt, 1, &begin, &end);
    for (int64_t r = begin; r < end; r++) {
        if (j->pass == 2) gn_normalise(j, r);
        else gn_stats(j, r);
    }
}

/* Per group, the runs' partials in run order. */
static void gn_reduce(const double *part, int64_t runs, int groups, double *out) {
    for (int g = 0; g < groups; g++) {
        double t = 0;
        for (int64_t r = 0; r < runs; r++) t += part[r * groups + g];
        out[g] = t;
    }
}

void lp_group_norm(lp_threadpool *pool, const float *x, float *y, int64_t npix, int64_t c, int groups,
                   const float *gamma, const float *beta, float eps, bool silu, double *scratch) {
    int64_t run_px = (npix + LP_GN_RUNS - 1) / LP_GN_RUNS, runs = (npix + run_px - 1) / run_px;
    double *sum = scratch, *ss = sum + LP_GN_RUNS * groups, *mean = ss + LP_GN_RUNS * groups, *inv = mean + groups;
    gn_job j = {.x = x, .y = y, .npix = npix, .c = c, .cg = c / groups, .run_px = run_px, .groups = groups,
                .gamma = gamma, .beta = beta, .silu = silu, .sum = sum, .ss = ss, .mean = mean, .inv = inv};
    /* small images run inline: waking the pool costs more */
    if (npix * c < 16384) pool = NULL;
    double count = (double)npix * (double)j.cg;
    lp_threadpool_run(pool, gn_worker, &j);
    gn_reduce(sum, runs, groups, mean);
    for (int g = 0; g < groups; g++) mean[g] /= count;
    j.pass = 1;
    lp_threadpool_run(pool, gn_worker, &j);
    gn_reduce(ss, runs, groups, inv);
    for (int g = 0; g < groups; g++) inv[g] = 1.0 / sqrt(inv[g] / count + (double)eps);
    j.pass = 2;
    lp_threadpool_run(pool, gn_worker, &j);
}

void lp_layer_norm(float *out, const float *x, int64_t rows, int64_t n, const float *gamma, const float *beta,
                   float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double sum = 0, ss = 0;
        for (int64_t i = 0; i < n; i++) sum += xr[i];
        double mean = sum / (double)n;
        for (int64_t i = 0; i < n; i++) ss += (xr[i] - mean) * (xr[i] - mean);
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps)), m = (float)mean;
        for (int64_t i = 0; i < n; i++) o[i] = (xr[i] - m) * inv * gamma[i] + beta[i];
    }
}

/* ---- activations ------------------------------------------------------------------ */

void lp_silu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = silu1(x[i]);
}

void lp_quick_gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

static float gelu1(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }

void lp_gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = gelu1(x[i]);
}

void lp_geglu(float *out, int64_t out_stride, const float *x, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        const float *a = x + r * 2 * d, *g = a + d;
        float *o = out + r * out_stride;
        for (int64_t i = 0; i < d; i++) o[i] = a[i] * gelu1(g[i]);
    }
}

/* ---- resampling --------------------------------------------------------------------- */

void lp_upsample_nearest2x(const float *x, float *y, int64_t h, int64_t w, int64_t c) {
    size_t bytes = (size_t)c * sizeof(float);
    for (int64_t yy = 0; yy < 2 * h; yy++)
        for (int64_t xx = 0; xx < 2 * w; xx++)
            memcpy(y + (yy * 2 * w + xx) * c, x + ((yy / 2) * w + xx / 2) * c, bytes);
}
