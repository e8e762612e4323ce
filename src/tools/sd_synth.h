/* Random-weight Stable Diffusion 1.x checkpoints (`loraplex synth --preset
 * sd15 | sd-tiny`): the single-file safetensors layout of src/image/sd.h
 * with uniform weights scaled by 1/sqrt(fan-in), norm gains near 1 and
 * small biases, each tensor seeded from the seed and its name. Written
 * streaming, one tensor in memory at a time (sd15 in F32 is 4.3 GB). */
#ifndef LP_TOOLS_SD_SYNTH_H
#define LP_TOOLS_SD_SYNTH_H

#include <stdint.h>

#include "../base/base.h"
#include "../formats/safetensors.h"
#include "../image/sd.h"

/* dtype: LP_ST_F32, LP_ST_F16 or LP_ST_BF16. */
int lp_sd_synth_write(const lp_sd_config *c, lp_st_dtype dtype, uint64_t seed, const char *preset,
                      const char *out_path, lp_error *err);
/* A loaded model written again in the diffusers folder layout: dir/
 * text_encoder/model.safetensors, unet/ and vae/ diffusion_pytorch_model
 * .safetensors (the VAE attention's 1x1 convs as linears, as diffusers
 * keeps them) and each part's config.json with what shapes cannot tell
 * (heads, GroupNorm groups). The tensors' bytes are copied as they are. */
int lp_sd_write_diffusers(const lp_sd_model *m, const char *dir, lp_error *err);
/* "sd15", "sd-tiny" or "sd-tiny-inpaint" -> config; -1 (err lists them) otherwise. */
int lp_sd_synth_preset(const char *name, lp_sd_config *c, lp_error *err);

#endif
