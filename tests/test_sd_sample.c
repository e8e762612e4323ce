/* The SD noise schedule and the samplers (src/image/sd_sample.c).
 * Schedule: SD 1.x's published sigma range (k-diffusion's sigma_min
 * 0.0292, sigma_max 14.6146), sigma <-> t round trips, the discrete, karras
 * and DDIM step lists. Samplers: on data x0 ~ N(0, s^2) the exact denoiser
 * is D(x, sigma) = x s^2 / (s^2 + sigma^2) and the probability-flow ODE from
 * x(sigma_max) = sigma_max n ends at s sigma_max / sqrt(s^2 + sigma_max^2) n:
 * euler, ddim and dpm++2m must converge to it (dpm++2m, a second-order
 * method, much closer for the same steps); the ancestral samplers (euler_a,
 * lcm) must produce samples of variance s^2, the same for a seed. */
#include "check.h"
#include "image/sd_sample.h"

#include <stdlib.h>
#include <string.h>

static const double S2 = 0.25; /* data variance */

static int gauss_denoiser(void *ctx, const float *x, double sigma, float *out, lp_error *err) {
    int64_t n = *(const int64_t *)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = (float)(x[i] * S2 / (S2 + sigma * sigma));
    return 0;
}

static void test_schedule(const lp_sd_schedule *s) {
    CHECK_NEAR(s->sigmas[0], 0.0291675, 1e-6);
    CHECK_NEAR(s->sigmas[999], 14.6146, 1e-3);
    CHECK_NEAR(s->alphas_cumprod[0], 1 - 0.00085, 1e-12);
    CHECK(s->alphas_cumprod[999] > 0.0046 && s->alphas_cumprod[999] < 0.0047);
    for (double t = 0; t <= 999; t += 37.25) CHECK_NEAR(lp_sd_sigma_to_t(s, lp_sd_t_to_sigma(s, t)), t, 1e-6);
    CHECK(lp_sd_sigma_to_t(s, 100.0) == 999.0 && lp_sd_sigma_to_t(s, 1e-4) == 0.0);

    double sg[21];
    CHECK(lp_sd_sigmas(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_DISCRETE, 20, sg) == 0);
    CHECK_NEAR(sg[0], s->sigmas[999], 1e-9);
    CHECK_NEAR(sg[19], s->sigmas[0], 1e-9);
    CHECK(sg[20] == 0);
    bool dec = true;
    for (int i = 0; i < 20; i++) dec = dec && sg[i] > sg[i + 1];
    CHECK(dec);
    CHECK(lp_sd_sigmas(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_KARRAS, 20, sg) == 0);
    CHECK_NEAR(sg[0], s->sigmas[999], 1e-9);
    CHECK_NEAR(sg[19], s->sigmas[0], 1e-9);
    /* karras: sigma^(1/7) is linear in the step */
    double a = pow(sg[0], 1 / 7.0), b = pow(sg[19], 1 / 7.0);
    CHECK_NEAR(pow(sg[10], 1 / 7.0), a + (b - a) * 10 / 19, 1e-9);
    /* DDIM, 20 steps: t = 951, 901, ..., 1 */
    CHECK(lp_sd_sigmas(s, LP_SD_SAMPLER_DDIM, LP_SD_SCHED_DISCRETE, 20, sg) == 0);
    CHECK_NEAR(sg[0], s->sigmas[951], 1e-12);
    CHECK_NEAR(sg[19], s->sigmas[1], 1e-12);
    CHECK(lp_sd_sigmas(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_DISCRETE, 0, sg) == -1);
    CHECK(lp_sd_sampler_parse("dpm++2m") == LP_SD_SAMPLER_DPMPP_2M && lp_sd_sampler_parse("plms") == -1);
}

/* relative error of the ODE end point */
static double ode_error(const lp_sd_schedule *s, int sampler, int scheduler, int steps) {
    enum { N = 64 };
    int64_t n = N;
    float x[N], scratch[3 * N];
    double sg[1001], noise[N];
    lp_sd_sigmas(s, sampler, scheduler, steps, sg);
    lp_rng r;
    lp_rng_seed(&r, 9);
    for (int i = 0; i < N; i++) x[i] = (float)(sg[0] * (noise[i] = lp_rng_normal(&r)));
    lp_error err = {0};
    CHECK(lp_sd_sample(sampler, sg, steps, x, n, gauss_denoiser, &n, &r, 1, scratch, NULL, NULL, &err) == 0);
    double k = sqrt(S2) * sg[0] / sqrt(S2 + sg[0] * sg[0]), e = 0, m = 0;
    for (int i = 0; i < N; i++) e = fmax(e, fabs(x[i] - k * noise[i])), m = fmax(m, fabs(k * noise[i]));
    return e / m;
}

static double ancestral_variance(const lp_sd_schedule *s, int sampler, int steps, uint64_t seed, float *first) {
    enum { N = 20000 };
    int64_t n = N;
    float *x = malloc(sizeof(float) * N), *scratch = malloc(sizeof(float) * 3 * N);
    double sg[LP_SD_TRAIN_STEPS + 1];
    lp_sd_sigmas(s, sampler, LP_SD_SCHED_KARRAS, steps, sg);
    lp_rng r;
    lp_rng_seed(&r, seed);
    for (int i = 0; i < N; i++) x[i] = (float)sg[0] * lp_rng_normal(&r);
    lp_error err = {0};
    CHECK(lp_sd_sample(sampler, sg, steps, x, n, gauss_denoiser, &n, &r, 1, scratch, NULL, NULL, &err) == 0);
    double v = 0;
    for (int i = 0; i < N; i++) v += (double)x[i] * x[i];
    *first = x[0];
    free(x), free(scratch);
    return v / N;
}

typedef struct steps_seen {
    int calls, last;
} steps_seen;

static void count_step(void *ctx, int step, int steps) {
    steps_seen *s = ctx;
    s->calls++;
    s->last = step == steps ? step : -1;
}

int main(void) {
    lp_sd_schedule *s = malloc(sizeof *s);
    lp_sd_schedule_init(s);
    test_schedule(s);

    double e_euler = ode_error(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_KARRAS, 50);
    double e_dpm = ode_error(s, LP_SD_SAMPLER_DPMPP_2M, LP_SD_SCHED_KARRAS, 50);
    double e_ddim = ode_error(s, LP_SD_SAMPLER_DDIM, LP_SD_SCHED_DISCRETE, 50);
    double e_euler200 = ode_error(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_DISCRETE, 200);
    CHECK_MSG(e_euler < 0.05, "euler 50 steps: %g", e_euler);
    CHECK_MSG(e_ddim < 0.05, "ddim 50 steps: %g", e_ddim);
    CHECK_MSG(e_euler200 < 0.02, "euler 200 steps: %g", e_euler200);
    CHECK_MSG(e_dpm < 1e-3 && e_dpm < e_euler / 10, "dpm++2m 50 steps: %g (euler %g)", e_dpm, e_euler);
    CHECK_MSG(ode_error(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_KARRAS, 10) > e_euler, "euler converges");

    /* euler_a solves the reverse SDE: its samples approach variance s^2 as
     * the steps grow (first order: 30 steps are visibly short of it) */
    float f1, f2, f3;
    double v30 = ancestral_variance(s, LP_SD_SAMPLER_EULER_A, 30, 1, &f1);
    double v = ancestral_variance(s, LP_SD_SAMPLER_EULER_A, 400, 1, &f2);
    CHECK_MSG(fabs(v - S2) < 0.03 * S2 && fabs(v30 - S2) > fabs(v - S2), "euler_a variance %g (30 steps %g), want %g",
              v, v30, S2);
    CHECK(ancestral_variance(s, LP_SD_SAMPLER_EULER_A, 30, 1, &f2) == v30 && f1 == f2); /* a seed's samples */
    ancestral_variance(s, LP_SD_SAMPLER_EULER_A, 30, 2, &f3);
    CHECK(f3 != f1);
    /* lcm with a posterior-mean denoiser: x <- D(x) + sigma' n, so the
     * variance follows v <- a^2 v + sigma'^2, a = s^2 / (s^2 + sigma^2) */
    v = ancestral_variance(s, LP_SD_SAMPLER_LCM, 4, 1, &f1);
    double sg4[5], want = 0;
    lp_sd_sigmas(s, LP_SD_SAMPLER_LCM, LP_SD_SCHED_KARRAS, 4, sg4);
    want = sg4[0] * sg4[0];
    for (int i = 0; i < 4; i++) {
        double a = S2 / (S2 + sg4[i] * sg4[i]);
        want = a * a * want + sg4[i + 1] * sg4[i + 1];
    }
    CHECK_MSG(fabs(v - want) < 0.03 * want, "lcm variance %g, want %g", v, want);

    /* the step callback sees every step */
    int64_t n = 4;
    float x[4] = {1, 2, 3, 4}, scratch[12];
    double sg[6];
    lp_sd_sigmas(s, LP_SD_SAMPLER_EULER, LP_SD_SCHED_DISCRETE, 5, sg);
    steps_seen seen = {0};
    lp_rng r;
    lp_rng_seed(&r, 1);
    lp_error err = {0};
    CHECK(lp_sd_sample(LP_SD_SAMPLER_EULER, sg, 5, x, n, gauss_denoiser, &n, &r, 1, scratch, count_step, &seen, &err) == 0);
    CHECK(seen.calls == 5 && seen.last == 5);
    free(s);
    return check_summary("test_sd_sample");
}
