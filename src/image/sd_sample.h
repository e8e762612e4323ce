/* SD 1.x's noise schedule and the samplers, in the k-diffusion form: a
 * latent at noise level sigma is x = x0 + sigma * n, a model is a denoiser
 * D(x, sigma) ~ x0, and a sampler walks a decreasing list of sigmas ending
 * at 0. The UNet's epsilon prediction becomes a denoiser through
 * D(x, sigma) = x - sigma * eps(x / sqrt(sigma^2 + 1), t(sigma)).
 *
 * The schedule: scaled-linear betas (sqrt(beta) linear from sqrt(0.00085)
 * to sqrt(0.012)) over 1000 steps; sigma_t = sqrt((1 - abar_t) / abar_t). */
#ifndef LP_IMAGE_SD_SAMPLE_H
#define LP_IMAGE_SD_SAMPLE_H

#include <stdint.h>

#include "../base/base.h"

#define LP_SD_TRAIN_STEPS 1000

typedef struct lp_sd_schedule {
    double alphas_cumprod[LP_SD_TRAIN_STEPS];
    double sigmas[LP_SD_TRAIN_STEPS];     /* increasing with t */
    double log_sigmas[LP_SD_TRAIN_STEPS];
} lp_sd_schedule;
void lp_sd_schedule_init(lp_sd_schedule *s);
/* The (fractional) timestep of a sigma: log-sigma interpolation in the
 * table, clamped to [0, 999]. */
double lp_sd_sigma_to_t(const lp_sd_schedule *s, double sigma);
double lp_sd_t_to_sigma(const lp_sd_schedule *s, double t);

typedef enum { LP_SD_SAMPLER_EULER, LP_SD_SAMPLER_EULER_A, LP_SD_SAMPLER_DDIM, LP_SD_SAMPLER_DPMPP_2M,
               LP_SD_SAMPLER_LCM } lp_sd_sampler;
typedef enum { LP_SD_SCHED_DISCRETE, LP_SD_SCHED_KARRAS } lp_sd_scheduler;
/* "euler" ... "lcm" / "discrete" "karras"; -1 for others. */
int lp_sd_sampler_parse(const char *name);
int lp_sd_scheduler_parse(const char *name);
const char *lp_sd_sampler_name(int sampler);

/* steps + 1 sigmas into out, the last 0. discrete: t = linspace(999, 0,
 * steps) through the table (k-diffusion's DiscreteSchedule); karras: rho 7
 * between the table's sigma_min and sigma_max; the ddim sampler takes DDIM's
 * "leading" timesteps t_i = i * (1000 / steps) + 1, descending, whatever
 * the scheduler. Returns -1 for steps < 1 or > 1000. */
int lp_sd_sigmas(const lp_sd_schedule *s, int sampler, int scheduler, int steps, double *out);

/* The denoiser: out = D(x, sigma) for n floats (one latent batch).
 * Returns 0 or -1 (then err is the callback's to fill). */
typedef int (*lp_sd_denoise_fn)(void *ctx, const float *x, double sigma, float *out, lp_error *err);
/* Called after each step (step = 1..steps). */
typedef void (*lp_sd_step_fn)(void *ctx, int step, int steps);

/* Runs `sampler` over sigmas[0..steps] on x (n floats, already scaled to
 * sigmas[0]), in place. scratch: 3 n floats. Ancestral samplers (euler_a,
 * lcm) draw their noise from rng[0..n_rng): x is n_rng equal segments (a
 * batch's images), segment k drawing from rng[k], so an image's noise does
 * not depend on the others in its batch. */
int lp_sd_sample(int sampler, const double *sigmas, int steps, float *x, int64_t n, lp_sd_denoise_fn fn, void *ctx,
                 lp_rng *rng, int n_rng, float *scratch, lp_sd_step_fn on_step, void *step_ctx, lp_error *err);

#endif
