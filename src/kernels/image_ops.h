/* The ops of an image model (Stable Diffusion's CLIP text encoder, UNet and
 * VAE): 2-D convolution, group and layer norm, the activations, nearest
 * upsampling and attention in tiles with a streaming softmax.
 *
 * Layout: activations are channels last. An image of h x w pixels and c
 * channels is h*w rows of c floats (pixel (y, x) is row y*w + x); a batch of
 * n images is n such blocks back to back. So a pixel is a token: a 1x1
 * convolution is one matmul over every pixel, and a transformer block runs
 * on the rows as they are.
 *
 * Convolution weights are lp_weight matrices of cout rows and kh*kw*cin
 * columns in (ky, kx, ci) order (lp_conv_weight_repack turns PyTorch's
 * [cout][cin][kh][kw] into it), so the convolution runs on lp_matmul: any
 * weight type lp_matmul takes, packed integer ones included.
 *
 * Nothing here allocates: callers pass scratch of the size the matching
 * *_scratch_floats function gives (plan it once). */
#ifndef LP_IMAGE_OPS_H
#define LP_IMAGE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* ---- convolution --------------------------------------------------------- */

typedef struct lp_conv2d_shape {
    int32_t n;            /* images */
    int32_t h, w, cin;    /* input, channels last */
    int32_t cout, kh, kw; /* kernel */
    int32_t stride, pad;  /* the same in both directions; stride >= 1 */
    int32_t pad_after;    /* more zeros after the end only, in both directions (the SD VAE
                           * encoder's downsample: pad 0, pad_after 1) */
} lp_conv2d_shape;

/* Output size (h + 2 pad + pad_after - kh) / stride + 1; <= 0 for a
 * kernel larger than the padded input. */
int32_t lp_conv2d_out_h(const lp_conv2d_shape *s);
int32_t lp_conv2d_out_w(const lp_conv2d_shape *s);
/* Checks a shape (positive sizes, stride >= 1, 0 <= pad, pad + pad_after < kernel, an output
 * of at least one pixel, sizes whose products fit). */
bool lp_conv2d_shape_ok(const lp_conv2d_shape *s);
/* Output pixels per im2col tile: the panel is tile x (kh*kw*cin) floats,
 * kept to about 2 MiB so it stays in cache while the weight streams. */
int64_t lp_conv2d_tile_pixels(const lp_conv2d_shape *s);
/* Floats of scratch lp_conv2d needs: 0 for a 1x1, stride 1, unpadded
 * convolution (it is a plain matmul), else one tile's panel. */
size_t lp_conv2d_scratch_floats(const lp_conv2d_shape *s);

/* y[img][oy][ox][co] = bias[co] + sum over ky, kx, ci of
 *   W[co][(ky*kw + kx)*cin + ci] * x[img][oy*stride + ky - pad][ox*stride + kx - pad][ci]
 * (zero outside the input). W is cout x kh*kw*cin; bias may be NULL. The
 * whole im2col matrix is never built: one tile of output pixels at a time
 * is gathered into scratch and multiplied (lp_matmul, parallel over output
 * channels). y must not overlap x. */
void lp_conv2d(const lp_kernels *k, lp_threadpool *pool, const lp_conv2d_shape *s, const lp_weight *W,
               const float *bias, const float *x, float *y, float *scratch);

/* ---- a runtime low-rank adapter's two passes (lowrank.c) ---- */

/* The shrink on a convolution of shape s (a linear is the 1x1, stride 1,
 * unpadded case with its rows as pixels; s->cout is ignored):
 *   t[q][j] = scale * sum over ky, kx, ci of dt[(ky*kw + kx)*cin + ci][j] * x[q's source pixel][ci]
 * for every output pixel q and j < r. dt is the adapter's down matrix
 * transposed, [kh*kw*cin][r]; t is [pixels][r]. Each sum is one fmaf chain
 * in (ky, kx, ci) order (zeros outside the input), then one multiply:
 * every level gives these bits. Parallel over pixels. */
void lp_lowrank_down(const lp_kernels *k, lp_threadpool *pool, const lp_conv2d_shape *s, const float *dt, int32_t r,
                     float scale, const float *x, float *t);
/* The expand, added in place: y[i][o] = fmaf(t[i][r-1], ut[r-1][o], ...
 * fmaf(t[i][0], ut[0][o], y[i][o])) for i < rows, o < out. ut is the up
 * matrix transposed, [r][out]; t is [rows][r]; rows of y are y_stride
 * floats apart. Every level gives these bits. Parallel over rows. */
void lp_lowrank_up(const lp_kernels *k, lp_threadpool *pool, int64_t rows, int32_t r, const float *t, const float *ut,
                   int64_t out, float *y, int64_t y_stride);

/* PyTorch's conv weight [cout][cin][kh][kw] -> [cout][kh][kw][cin], the
 * column order lp_conv2d reads. dst must not overlap src. */
void lp_conv_weight_repack(const float *src, int64_t cout, int64_t cin, int64_t kh, int64_t kw, float *dst);

/* ---- normalisation ---------------------------------------------------------- */

/* GroupNorm over one image of npix pixels and c channels (c a multiple of
 * groups): each group of c/groups consecutive channels is normalised over
 * all its npix*c/groups values (mean and variance in double, two passes),
 * then y = norm * gamma[ch] + beta[ch], then SiLU when silu. y may be x.
 * Each pass runs over the pixels in order on pool's threads (NULL: this
 * one); the statistics come out the same for any thread count. scratch:
 * lp_group_norm_scratch_doubles(groups) doubles. */
#define LP_GN_RUNS 64
size_t lp_group_norm_scratch_doubles(int groups);
void lp_group_norm(lp_threadpool *pool, const float *x, float *y, int64_t npix, int64_t c, int groups,
                   const float *gamma, const float *beta, float eps, bool silu, double *scratch);
/* LayerNorm of each of rows rows of n floats: (x - mean) / sqrt(var + eps)
 * * gamma + beta (statistics in double). out may be x. */
void lp_layer_norm(float *out, const float *x, int64_t rows, int64_t n, const float *gamma, const float *beta,
                   float eps);

/* ---- activations (in place) ---------------------------------------------------- */

void lp_silu(float *x, int64_t n);       /* x * sigmoid(x) */
void lp_quick_gelu(float *x, int64_t n); /* x * sigmoid(1.702 x) (CLIP) */
void lp_gelu(float *x, int64_t n);       /* exact: x/2 (1 + erf(x / sqrt 2)) */
/* GEGLU: rows rows of 2d floats [a | g] -> out rows of d floats a * gelu(g)
 * (diffusers' GEGLU: the first half is the value, the second the gate). out
 * rows have stride out_stride; out may be x (row r's output lies at or
 * before its input). */
void lp_geglu(float *out, int64_t out_stride, const float *x, int64_t rows, int64_t d);

/* ---- resampling ------------------------------------------------------------- */

/* Nearest x2: y is (2h) x (2w) x c, y[2y+i][2x+j] = x[y][x]. */
void lp_upsample_nearest2x(const float *x, float *y, int64_t h, int64_t w, int64_t c);

/* ---- attention ------------------------------------------------------------- */

/* Multi-head attention, optionally causal. Query row i of head h is the d
 * floats at q + i*q_stride + h*d (keys and values likewise, with their
 * strides); output row i of head h goes to out + i*out_stride + h*d:
 *   out = sum_j softmax_j(scale * q_i . k_j) v_j.
 * Keys run in tiles of LP_ATTN_KEY_TILE with a streaming (online) softmax:
 * a running maximum and sum per query, so the nq x nk score matrix never
 * exists; work is split over (head, tile of LP_ATTN_QUERY_TILE queries). */
#define LP_ATTN_QUERY_TILE 32
#define LP_ATTN_KEY_TILE 64
typedef struct lp_attn_shape {
    int64_t nq, nk; /* queries, keys (= values) */
    int32_t heads;
    int64_t d;      /* head width */
    int64_t q_stride, k_stride, v_stride, out_stride;
    float scale;    /* usually 1 / sqrt(d) */
    bool causal;    /* query i sees keys j <= i only (CLIP's text encoder) */
} lp_attn_shape;
/* Floats of scratch for n_threads threads. */
size_t lp_attention_scratch_floats(int n_threads, int64_t d);
void lp_attention_tiled(const lp_kernels *k, lp_threadpool *pool, const lp_attn_shape *s, const float *q,
                        const float *key, const float *v, float *out, float *scratch);

#endif
