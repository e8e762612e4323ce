/* Text to image with SD 1.x: tokenize, encode the prompt (and the negative
 * prompt when guidance is on), sample the latent with the UNet, decode it;
 * image to image and inpainting from an init image the VAE encodes.
 * Classifier-free guidance runs the unconditional and the conditional rows
 * as one UNet batch of 2. Deterministic for a seed: the initial noise and
 * the ancestral samplers' noise come from lp_rng seeded with it. */
#ifndef LP_IMAGE_SD_PIPELINE_H
#define LP_IMAGE_SD_PIPELINE_H

#include <stdint.h>

#include "../base/base.h"
#include "../tokenizer/clip.h"
#include "sd_graph.h"
#include "sd_sample.h"

#define LP_SD_MAX_IMAGES 32

/* Where a run's time went, in seconds (lp_sd_generate fills it when
 * lp_sd_gen_params.timings is set). */
typedef struct lp_sd_timings {
    double text;   /* the prompts' tokens through the text encoder */
    double encode; /* the VAE encoder (image to image, inpainting) */
    double unet;   /* the sampler's steps (UNet calls and guidance) */
    int steps;     /* steps run */
    double decode; /* the VAE decoder, every image */
} lp_sd_timings;

typedef struct lp_sd_gen_params {
    const char *prompt, *negative; /* negative NULL: "" */
    int width, height;             /* pixels, multiples of 8 * 2^(UNet levels - 1) */
    int steps;
    float cfg;                     /* 1: no guidance (one row) */
    int sampler, scheduler;        /* LP_SD_SAMPLER_*, LP_SD_SCHED_* */
    uint64_t seed;
    int clip_skip;                 /* 1: the last layer */
    int n_threads;
    bool int8_activations;         /* LP_W8 weights: W8A8 (else W8A16) */
    const float *noise;            /* NULL, or the initial noise [4][h/8][w/8] */
    lp_sd_row_loras loras;         /* adapters of both guidance rows (runtime inputs) */
    /* batch > 1: that many images in one UNet batch (2 rows each with
     * guidance); image b takes prompts[b] (NULL or a NULL entry: prompt),
     * image_loras[b] (NULL: loras), its initial noise and its ancestral
     * samplers' noise from seed + b, so with any sampler it is the image a
     * run with that seed and those adapters alone makes, bit for bit */
    int batch;
    const char *const *prompts;
    const lp_sd_row_loras *image_loras;
    /* image to image: init (width x height x 3 bytes, NULL: text to image)
     * is encoded by the VAE (its mean) and noised to the sigma of step
     * steps - floor(steps * strength); the sampler runs the steps from there
     * (strength 1: every step, from the init's latent plus full noise) */
    const uint8_t *init;
    float strength;
    /* inpainting (needs init): width x height bytes, >= 128 repaints the
     * pixel. A 4-channel UNet keeps the latent outside the mask (each 8x8
     * block's share) on the init's, noised to each step's sigma, and equal
     * to it at the end; a 9-channel inpainting UNet (which needs a mask)
     * takes [latent, mask, latent of the init with the masked pixels
     * zeroed] as its input, as it was trained */
    const uint8_t *mask;
    lp_sd_step_fn on_step;
    void *step_ctx;
    lp_sd_timings *timings; /* NULL, or filled */
} lp_sd_gen_params;

/* latents_out (may be NULL): the final latents [batch][4][h/8][w/8]
 * (channels first, as --latents-out writes them); rgb: batch x height x
 * width x 3 bytes. */
/* Encodes text into ids[0..n_ctx) as lp_clip_encode does, except that the
 * adapters' textual-inversion tokens ("<s1>") found in the text become
 * their ids (vocab + j, in the adapters' order); the text between them is
 * tokenized as usual. */
int lp_sd_encode_prompt(const lp_clip_tokenizer *tok, const lp_sd_row_loras *loras, const char *text, int32_t *ids,
                        int n_ctx, lp_error *err);

int lp_sd_generate(const lp_sd_weights *w, const lp_clip_tokenizer *tok, const lp_sd_gen_params *p,
                   float *latents_out, uint8_t *rgb, lp_error *err);

#endif
