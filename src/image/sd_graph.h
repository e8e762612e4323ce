/* The graphs of Stable Diffusion 1.x over the image ops: the CLIP text
 * encoder, the UNet (one denoising step for a batch of latents, each row
 * its own timestep and context) and the VAE's decoder and encoder.
 *
 * lp_sd_weights converts a loaded checkpoint once (conv kernels repacked
 * to lp_conv2d's column order), to f32 or with int8 matrices. lp_sd_graph plans every
 * activation buffer once for a batch and latent size; the calls allocate
 * nothing. Activations are channels last (image_ops.h). */
#ifndef LP_IMAGE_SD_GRAPH_H
#define LP_IMAGE_SD_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"
#include "../base/dtype.h"
#include "sd.h"
#include "sd_lora.h"

typedef struct lp_sd_weights lp_sd_weights;
/* weight_type LP_F32, or LP_W8: every linear and conv weight with columns
 * a multiple of 32 and 16 rows or more becomes int8 with one scale per
 * output channel (all but the convs of the image's own 3-8 channels and the
 * embedding tables; sd_graph.c says why); the rest stays f32. */
lp_sd_weights *lp_sd_weights_create(const lp_sd_model *m, uint32_t weight_type, lp_error *err);
void lp_sd_weights_free(lp_sd_weights *w);
const lp_sd_config *lp_sd_weights_config(const lp_sd_weights *w);
/* The compiled form (sd_compiled.h; `loraplex compile`): the weights as
 * they are, with the activations a run should default to (int8: W8A8). */
int lp_sd_weights_save(const lp_sd_weights *w, bool int8_activations, const char *path, lp_error *err);
/* Memory-maps a compiled file: no conversion, pages read as used. */
lp_sd_weights *lp_sd_weights_open(const char *path, lp_error *err);
/* The same from an image in memory (64-byte aligned, kept by the caller
 * while the weights live); name is for messages. */
lp_sd_weights *lp_sd_weights_open_memory(const void *data, size_t size, const char *name, lp_error *err);
uint32_t lp_sd_weights_type(const lp_sd_weights *w);
/* A compiled (memory-mapped) model's pages of one part (lp_sd_part) out of
 * memory until touched again, when they are read back from the file; a
 * no-op for converted weights. The pipeline drops the text encoder once the
 * prompts are encoded and the UNet before decoding, so the peak holds the
 * largest part and its activations, not every part at once. */
void lp_sd_weights_evict(const lp_sd_weights *w, int part);
/* A compiled file's activations (false for converted weights). */
bool lp_sd_weights_int8_activations(const lp_sd_weights *w);
/* Bytes the weights hold in f32 and in int8 matrices (scales included). */
void lp_sd_weights_bytes(const lp_sd_weights *w, int64_t *f32_bytes, int64_t *w8_bytes);

typedef struct lp_sd_graph lp_sd_graph;
/* Buffers for up to max_batch rows of lat_h x lat_w latents (multiples of
 * 2^(UNet levels - 1)); n_threads workers (1: none). */
lp_sd_graph *lp_sd_graph_create(const lp_sd_weights *w, int max_batch, int lat_h, int lat_w, int n_threads,
                                lp_error *err);
void lp_sd_graph_free(lp_sd_graph *g);
/* LP_W8 weights: activations quantized to int8 per row (W8A8, integer dot
 * products) when on, else kept in float against dequantized weights
 * (W8A16; the default). No effect on f32 weights. */
void lp_sd_graph_set_int8_activations(lp_sd_graph *g, bool on);

/* The adapters of batch rows 0..n-1 (row i of every later call: text
 * encoder, UNet) until the next call; n = 0: none. Adapters are read, not
 * copied, and must outlive their use; each must have been loaded for this
 * model's configuration. The only call that may allocate (the adapters'
 * scratch, when a rank exceeds every earlier one). */
int lp_sd_graph_set_loras(lp_sd_graph *g, const lp_sd_row_loras *rows, int n, lp_error *err);
/* Textual-inversion tokens of row's adapters: their count, and the
 * embedding of the j-th (the text encoder's id te_vocab + j), or NULL. */
int lp_sd_graph_added_tokens(const lp_sd_graph *g, int row);
const float *lp_sd_graph_added_token(const lp_sd_graph *g, int row, int32_t j);

/* ids [batch][te_ctx] -> out [batch][te_ctx][te_dim]: the last hidden state
 * after the final layer norm; clip_skip k >= 1 stops k - 1 layers early
 * (then the final norm), as "clip skip" does in SD front ends. */
int lp_sd_text_encode(lp_sd_graph *g, const int32_t *ids, int batch, int clip_skip, float *out, lp_error *err);
/* x [batch][lat_h][lat_w][unet_in], t[batch] timesteps, ctx
 * [batch][te_ctx][context_dim] -> eps [batch][lat_h][lat_w][unet_out]. */
int lp_sd_unet(lp_sd_graph *g, const float *x, const float *t, const float *ctx, int batch, float *eps,
               lp_error *err);
/* z [batch][lat_h][lat_w][vae_z] (scaled latents: divided by 0.18215
 * first) -> img [batch][lat_h*f][lat_w*f][vae_img], f = 2^(VAE levels - 1),
 * values about [-1, 1]. */
int lp_sd_vae_decode(lp_sd_graph *g, const float *z, int batch, float *img, lp_error *err);
/* img [batch][lat_h*f][lat_w*f][vae_img] (values about [-1, 1]) -> z
 * [batch][lat_h][lat_w][vae_z]: the mean of the encoder's latent
 * distribution times 0.18215 (the mode, not a draw: deterministic). */
int lp_sd_vae_encode(lp_sd_graph *g, const float *img, int batch, float *z, lp_error *err);

#endif
