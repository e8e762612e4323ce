/* Random SD 1.x LoRA files in the formats the loader reads (src/image/sd_lora.h),
 * for tests and benchmarks (`loraplex synth --preset sd15-lora | sd-tiny-lora`):
 *   kohya        every linear and conv of the text encoder and the UNet
 *                (3x3 convs as LoCon: a 3x3 down, a 1x1 up), alpha = rank / 2
 *   diffusers    the UNet's attention projections, processor keys
 *   peft         every linear, lora_A / lora_B with unet. / text_encoder. prefixes
 *   cloneofsimo  the UNet's attention and GEGLU linears and the text
 *                encoder's attention in module order, and one token "<s1>"
 * down ~ U(-1, 1) / sqrt(fan-in), up ~ U(-1, 1) / sqrt(rank), F32; the
 * values of a tensor follow from the seed and its key. */
#ifndef LP_TOOLS_SD_LORA_SYNTH_H
#define LP_TOOLS_SD_LORA_SYNTH_H

#include <stdint.h>

#include "../base/base.h"
#include "../image/sd.h"

int lp_sd_synth_lora(const lp_sd_config *c, const char *format, int rank, uint64_t seed, const char *out_path,
                     lp_error *err);

#endif
