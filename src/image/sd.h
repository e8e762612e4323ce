/* Stable Diffusion 1.x: the model's configuration, the tensor layout of the
 * original single-file checkpoint (`model.diffusion_model.*` UNet,
 * `cond_stage_model.transformer.*` CLIP text encoder, `first_stage_model.*`
 * VAE), and its loader.
 *
 * The layout is a function of the configuration (lp_sd_layout lists every
 * tensor with its PyTorch shape), so the loader, the random-weight writer
 * (src/tools/sd_synth.c) and the graphs agree on one list. The loader reads
 * the configuration back from the shapes and names of a file (and from
 * `loraplex.sd.*` metadata for what shapes cannot tell: head counts). */
#ifndef LP_IMAGE_SD_H
#define LP_IMAGE_SD_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../formats/safetensors.h"

#define LP_SD_MAX_LEVELS 4
#define LP_SD_VAE_SCALE 0.18215f

typedef struct lp_sd_config {
    /* CLIP text encoder */
    int32_t te_vocab, te_ctx, te_dim, te_layers, te_heads, te_ffn;
    /* UNet: levels of unet_ch * unet_mult[l] channels, res_blocks ResBlocks
     * each going down (res_blocks + 1 going up), a SpatialTransformer after
     * each ResBlock of a level with unet_attn[l], a stride-2 conv between
     * levels going down and a nearest x2 + conv going up; the middle block
     * is ResBlock, SpatialTransformer, ResBlock. */
    int32_t unet_in, unet_out, unet_ch, unet_levels, unet_mult[LP_SD_MAX_LEVELS], unet_res_blocks;
    bool unet_attn[LP_SD_MAX_LEVELS];
    int32_t unet_heads, context_dim; /* heads of every SpatialTransformer; context = te_dim */
    /* VAE (AutoencoderKL): levels of vae_ch * vae_mult[l] channels */
    int32_t vae_img, vae_z, vae_ch, vae_levels, vae_mult[LP_SD_MAX_LEVELS], vae_res_blocks;
    int32_t groups; /* GroupNorm groups, UNet and VAE */
} lp_sd_config;

/* Stable Diffusion 1.5's configuration (ViT-L/14 text encoder, 320-1280
 * UNet, 128-512 VAE). */
lp_sd_config lp_sd_config_sd15(void);
/* A few-megabyte model of the same structure for tests: the real CLIP
 * vocabulary and context, 32- and 64-wide everything else, a UNet of two
 * levels (attention on the first, as SD has none on its last), a VAE of
 * four (x8, as SD's), one ResBlock per level. */
lp_sd_config lp_sd_config_tiny(void);
/* Checks a configuration's consistency (channels multiples of groups and
 * heads, levels 1..4, ...). */
int lp_sd_config_check(const lp_sd_config *c, lp_error *err);

/* One tensor of the layout: name and PyTorch shape (outermost first). */
typedef struct lp_sd_tensor_desc {
    char name[128];
    int32_t n_dims;
    int64_t shape[4];
} lp_sd_tensor_desc;
/* Calls fn for every tensor of c's checkpoint in a fixed order; stops at
 * (and returns) the first non-zero return. */
typedef int (*lp_sd_tensor_fn)(void *ctx, const lp_sd_tensor_desc *t);
int lp_sd_layout(const lp_sd_config *c, lp_sd_tensor_fn fn, void *ctx);
/* Parameter counts of the three parts. */
typedef struct lp_sd_counts {
    int64_t tensors, te, unet, vae;
} lp_sd_counts;
lp_sd_counts lp_sd_layout_counts(const lp_sd_config *c);
/* Whether weight_type LP_W8 holds t as an int8 matrix (one scale per
 * output channel), and its rows x cols (conv kernels as [out][k*k*in]):
 * every linear and conv weight with columns a multiple of 32 and 16 rows
 * or more, but the embedding tables. The rest stays f32. */
bool lp_sd_tensor_w8(uint32_t weight_type, const lp_sd_tensor_desc *t, int64_t *rows, int64_t *cols);
/* The bytes t takes as weight_type holds it (LP_W8 panels or f32; 0 on
 * overflow), whether it is an int8 matrix, and its rows x cols (f32: the
 * first dimension by the rest). */
uint64_t lp_sd_tensor_bytes(uint32_t weight_type, const lp_sd_tensor_desc *t, bool *w8, int64_t *rows, int64_t *cols);

/* ---- diffusers names ------------------------------------------------------------------------ */

/* The three parts of a model, which are three files in the diffusers folder layout. */
typedef enum { LP_SD_PART_TE = 0, LP_SD_PART_UNET = 1, LP_SD_PART_VAE = 2 } lp_sd_part;
/* The diffusers (and transformers, for the text encoder) name of a
 * checkpoint module ("model.diffusion_model.input_blocks.1.0.in_layers.2")
 * or tensor (the same with ".weight" / ".bias") in c's layout: written to
 * out, the part returned; -1 for a name outside the layout. The VAE's
 * middle attention takes diffusers' newer names (to_q ... to_out.0). */
int lp_sd_diffusers_module(const lp_sd_config *c, const char *ldm, char *out, size_t cap);
int lp_sd_diffusers_name(const lp_sd_config *c, const char *ldm, char *out, size_t cap);

/* ---- the single-file checkpoint ------------------------------------------------------------ */

typedef struct lp_sd_model lp_sd_model;
/* Opens a single-file SD 1.x safetensors checkpoint, or a diffusers folder
 * (path/unet exists: text_encoder/model.safetensors, unet/ and vae/
 * diffusion_pytorch_model.safetensors, each part's config.json for heads and
 * groups; tensors found by lp_sd_diffusers_name, and named so in errors): infers the
 * configuration, then checks that every tensor of its layout is present
 * with its shape and an F32, F16 or BF16 dtype. Tensors outside the three
 * parts (model_ema.*, the schedule's buffers, position_ids) are ignored.
 * Errors name the file and the first tensor at fault. */
lp_sd_model *lp_sd_model_load(const char *path, lp_error *err);
/* The same from a file's bytes in memory (kept by the caller while the
 * model lives); name is for messages. */
lp_sd_model *lp_sd_model_load_memory(const void *data, size_t size, const char *name, lp_error *err);
void lp_sd_model_free(lp_sd_model *m);
const lp_sd_config *lp_sd_model_config(const lp_sd_model *m);
/* The tensor of that checkpoint name (a folder's: under its diffusers
 * name), or NULL. */
const lp_st_tensor *lp_sd_model_tensor(const lp_sd_model *m, const char *name);
/* Tensors of the file outside the layout (ignored). */
int64_t lp_sd_model_ignored(const lp_sd_model *m);

#endif
