/* Private to the train layer: saved activations, backward scratch and the
 * threaded matrix / attention kernels shared by forward.c and backward. */
#ifndef LP_TRAIN_INTERNAL_H
#define LP_TRAIN_INTERNAL_H

#include "train.h"

struct lp_tacts {
    int max_batch, max_seq;   /* capacity: B <= max_batch, T <= max_seq */
    int B, T;                 /* shape of the last forward */
    double loss, mask_sum, kl;
    /* forward, per layer l (index [l][n][...]) */
    float *x;                 /* [L+1][N][dim] residual stream entering layer l; [L] = final */
    float *xn1, *rstd1;       /* [L][N][dim], [L][N] attention RMSNorm */
    float *q, *k, *v;         /* [L][N][q_dim], [L][N][kv_dim] x2, after RoPE */
    float *att;               /* [L][B][H][T][T] softmax probabilities */
    float *att_out;           /* [L][N][q_dim] */
    float *x_mid;             /* [L][N][dim] after the attention residual */
    float *xn2, *rstd2;       /* FFN RMSNorm */
    float *gate, *up, *h;     /* [L][N][ffn] pre-activation gate, up, silu(gate)*up */
    float *lora_t;            /* [L][P][N][rank]: A x per target projection */
    float *xnf, *rstdf;       /* [N][dim], [N] final norm */
    float *logits;            /* [N][n_vocab] */
    float *rope_cos, *rope_sin; /* [N][head_dim/2] */
    /* backward scratch (one layer at a time) */
    float *dlogits;           /* [N][n_vocab] */
    float *dx, *dxn, *dtmp;   /* [N][max(dim, q_dim)] */
    float *dq, *dk, *dv, *datt_out; /* [N][q_dim], [N][kv_dim] x2, [N][q_dim] */
    float *dgate, *dup, *dh;  /* [N][ffn] */
    float *dlora;             /* [N][rank] */
    float *datt;              /* [B][H][T][T] scratch for dP: a (b,h) row, or all rows (AVX-512) */
    float *scratch;           /* transposes for the matmul backward */
    /* [max N] each, one allocation (row_loss owns it): each row's cross-entropy
     * and KL (summed in row order afterwards), and its logit max and sum of
     * exp(z - max), which the backward reuses */
    double *row_loss, *row_kl, *row_max, *row_sum;
    size_t scratch_floats;
};

/* ---- kernels (ops.c) ------------------------------------------------------ */

/* The one matrix kernel: Y[r][c] (+)= alpha * sum_k A[r][k] Bm[c][k]
 * ("A times B transposed", both row-major with the reduction contiguous).
 * Threaded over rows r; each element is summed in one fixed order, so the
 * result doesn't depend on the thread count. */
void lp_t_gemm_nt(lp_threadpool *pool, float *Y, const float *A, const float *Bm, int R,
                  int C, int K, float alpha, bool accumulate);
/* The three linear-layer products. level: 0 plain C (lp_t_gemm_nt),
 * 1 AVX2+FMA, 2 AVX-512 (the caller checks the CPU, see
 * lp_t_gemm_best_level). scratch: N*(in+out) and in*out floats suffice.
 * Y[n][o] (+)= alpha * sum_i X[n][i] W[o][i]  (a linear layer forward). */
void lp_t_matmul(lp_threadpool *pool, int level, float *Y, const float *X, const float *W,
                 int N, int in, int out, float alpha, bool accumulate, float *scratch);
/* dX[n][i] (+)= alpha * sum_o dY[n][o] W[o][i]. */
void lp_t_matmul_dx(lp_threadpool *pool, int level, float *dX, const float *dY,
                    const float *W, int N, int in, int out, float alpha, bool accumulate,
                    float *scratch);
/* dW[o][i] += alpha * sum_n dY[n][o] X[n][i]. */
void lp_t_matmul_dw(lp_threadpool *pool, int level, float *dW, const float *dY,
                    const float *X, int N, int in, int out, float alpha, float *scratch);
/* The fastest level this CPU runs. */
int lp_t_gemm_best_level(void);

/* fn(ctx, begin, end) over [0, n) split among the pool's threads; the work
 * is about n x cost_per operations, and small work stays on this thread. */
typedef void (*lp_t_range_fn)(void *ctx, int64_t begin, int64_t end);
void lp_t_parallel_for(lp_threadpool *pool, int64_t n, int64_t cost_per, lp_t_range_fn fn, void *ctx);

/* The row- and element-wise operations take the pool too (NULL: this
 * thread); results do not depend on the thread count. */
void lp_t_rmsnorm(lp_threadpool *pool, float *y, float *rstd, const float *x, const float *w, int N,
                  int n, float eps);
/* dx (+)= ..., dw += ... (dw may be NULL). dx must not alias dy or x. */
void lp_t_rmsnorm_backward(lp_threadpool *pool, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int N, int n, bool accumulate);

/* Rotates pairs (2i, 2i+1) of every head by the row's angle (sign = +1) or
 * back (sign = -1, the backward). */
void lp_t_rope(lp_threadpool *pool, float *x, const float *cos, const float *sin, int N, int n_heads,
               int head_dim, float sign);

void lp_t_swiglu(lp_threadpool *pool, float *h, const float *gate, const float *up, int64_t n);
void lp_t_swiglu_backward(lp_threadpool *pool, float *dgate, float *dup, const float *dh,
                          const float *gate, const float *up, int64_t n);

typedef struct lp_t_attn {
    int B, T, n_heads, n_kv_heads, head_dim;
    const uint8_t *visible;   /* NULL: causal */
    int level;                /* instruction set, as lp_train_model.gemm_level */
    const float *q, *k, *v;
    float *att, *out;
    /* backward */
    const float *dout;
    float *dq, *dk, *dv, *datt;
} lp_t_attn;

void lp_t_attention(lp_threadpool *pool, lp_t_attn *a);
/* Overwrites dq, dk, dv. */
void lp_t_attention_backward(lp_threadpool *pool, lp_t_attn *a);

void lp_t_free_acts(lp_tacts *a);

/* QUAD hooks (quad.c), called by the forward where m->quad is set. The
 * base matmul's input as the W4A8 kernels see it (NULL: x as is); the LoRA
 * branch under static encodings, adding into y and saving the dequantized
 * shrink outputs in t (true if it ran; false: the float branch runs); and
 * the observation of the float branch's ranges. */
const float *lp_t_quad_base_input(lp_train_model *m, const float *x, int N, int in);
bool lp_t_quad_branch(lp_train_model *m, int l, int p, float *y, const float *x, int N, float *t);
void lp_t_quad_observe(lp_train_model *m, int l, int p, const float *x, const float *t, int N);
/* Floats per group for a config, without allocating them. */
int lp_t_param_counts(const lp_train_config *cfg, size_t sizes[3], lp_error *err);

/* Parameter-table helpers (params.c). */
void lp_t_bind(const lp_train_model *m, float *const groups[3], lp_tweights *w);
size_t lp_t_lora_rows_in(const lp_train_config *c, int p);
size_t lp_t_lora_rows_out(const lp_train_config *c, int p);

#endif
