/* LoRA adapters for SD 1.x as runtime inputs: the graph adds
 * scale * up (down x) to a module's output for the batch rows that use the
 * adapter, so the frozen weights are never changed and every row of a batch
 * may use its own adapters (sd_graph.h, lp_sd_graph_set_loras).
 *
 * The modules an adapter may target are the text encoder's and the UNet's
 * linears and convs (lp_sd_targets, from the configuration alone, with
 * their checkpoint (ldm) and diffusers names). The loader reads the four
 * formats found in the wild and maps every key or rejects the file naming
 * the first key it cannot map:
 *   - Kohya / sd-scripts: lora_unet_<module>.lora_down.weight / .lora_up.weight
 *     / .alpha, lora_te_<module>...; <module> is the diffusers or the ldm
 *     name with '.' written '_'; convs ("LoCon") take a k x k down and a
 *     1x1 up; scale alpha / rank (1 without alpha)
 *   - diffusers attention processors: <attn>.processor.to_q_lora.down.weight
 *     (to_k, to_v, to_out); scale 1
 *   - PEFT / diffusers: [unet.|text_encoder.]<module>.lora_A.weight /
 *     .lora_B.weight (also .lora.down/.lora.up, .lora_linear_layer.down/up);
 *     scale lora_alpha / rank from an adapter_config.json beside the file,
 *     a <module>.alpha key, or 1
 *   - cloneofsimo `lora`: unet:N:down / unet:N:up, text_encoder:N:...; N is
 *     the N-th linear of the target classes named in the metadata, in the
 *     diffusers/transformers module order (checked against every shape);
 *     metadata keys valued "<embed>" are textual-inversion tokens: the
 *     prompt's "<s1>" becomes a token whose embedding is that tensor.
 * Tensors may be F32, F16 or BF16; the loader keeps f32 copies. */
#ifndef LP_IMAGE_SD_LORA_H
#define LP_IMAGE_SD_LORA_H

#include <stdint.h>

#include "../base/base.h"
#include "sd.h"


/* One module an adapter may target. */
typedef struct lp_sd_target {
    char ldm[112];       /* checkpoint name without ".weight" */
    char diffusers[112]; /* diffusers / transformers name (text encoder: text_model.encoder...) */
    int32_t part;        /* lp_sd_part */
    int32_t out, in, k;  /* k: 0 for a linear [out][in], else a k x k conv [out][in][k][k] */
} lp_sd_target;

typedef struct lp_sd_targets {
    int32_t n;
    lp_sd_target *t;
} lp_sd_targets;

int lp_sd_targets_build(const lp_sd_config *c, lp_sd_targets *out, lp_error *err);
void lp_sd_targets_free(lp_sd_targets *t);
/* Index of the target of that checkpoint name (no ".weight"), or -1. */
int32_t lp_sd_target_find(const lp_sd_targets *t, const char *ldm);

/* The delta of one module: scale * up (down x). Both matrices are kept
 * transposed, the layout of lp_lowrank_down / lp_lowrank_up. */
typedef struct lp_sd_delta {
    int32_t target, rank;
    float scale;       /* alpha / rank, or 1 */
    const float *down; /* [cols][rank]: cols = in, or k * k * in in lp_conv2d's column order [kh][kw][in] */
    const float *up;   /* [rank][out] */
} lp_sd_delta;

typedef struct lp_sd_lora lp_sd_lora;

/* Reads an adapter file for a model of configuration c. Errors name the
 * file and the first key at fault. */
lp_sd_lora *lp_sd_lora_load(const char *path, const lp_sd_config *c, lp_error *err);
/* The same from bytes in memory (copied from, not kept); peft_config: the
 * text of an adapter_config.json, or NULL. */
lp_sd_lora *lp_sd_lora_load_memory(const void *data, size_t size, const char *name, const char *peft_config,
                                   const lp_sd_config *c, lp_error *err);
void lp_sd_lora_free(lp_sd_lora *l);

const lp_sd_config *lp_sd_lora_config(const lp_sd_lora *l);
const char *lp_sd_lora_format(const lp_sd_lora *l); /* "kohya", "diffusers", "peft", "cloneofsimo" */
int32_t lp_sd_lora_count(const lp_sd_lora *l, int part); /* modules adapted in that part; -1: all */
int32_t lp_sd_lora_max_rank(const lp_sd_lora *l);
/* The delta on target i, or NULL. */
const lp_sd_delta *lp_sd_lora_delta(const lp_sd_lora *l, int32_t target);
/* Textual-inversion tokens: their text ("<s1>") and embedding [te_dim]. */
int32_t lp_sd_lora_n_tokens(const lp_sd_lora *l);
const char *lp_sd_lora_token(const lp_sd_lora *l, int32_t i);
const float *lp_sd_lora_token_embedding(const lp_sd_lora *l, int32_t i);

/* One adapter a batch row uses, at a multiplier (1: as trained). */
typedef struct lp_sd_lora_use {
    const lp_sd_lora *lora;
    float scale;
} lp_sd_lora_use;

#define LP_SD_MAX_ROW_LORAS 8

/* The adapters of one batch row, applied in this order. */
typedef struct lp_sd_row_loras {
    int32_t n;
    lp_sd_lora_use use[LP_SD_MAX_ROW_LORAS];
} lp_sd_row_loras;

#endif
