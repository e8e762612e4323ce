/* The schedule and the samplers (see sd_sample.h). The update rules are
 * k-diffusion's (Karras et al. 2022 form): euler, euler ancestral,
 * DPM-Solver++(2M), and LCM's multistep sampling; DDIM (eta 0) is the Euler
 * step on DDIM's own timesteps, which is what DDIM is in sigma space. */
#include "sd_sample.h"

#include <math.h>
#include <string.h>

void lp_sd_schedule_init(lp_sd_schedule *s) {
    double lo = sqrt(0.00085), hi = sqrt(0.012), prod = 1.0;
    for (int i = 0; i < LP_SD_TRAIN_STEPS; i++) {
        double b = lo + (hi - lo) * i / (LP_SD_TRAIN_STEPS - 1);
        prod *= 1.0 - b * b;
        s->alphas_cumprod[i] = prod;
        s->sigmas[i] = sqrt((1.0 - prod) / prod);
        s->log_sigmas[i] = log(s->sigmas[i]);
    }
}

double lp_sd_sigma_to_t(const lp_sd_schedule *s, double sigma) {
    double ls = log(sigma);
    if (ls <= s->log_sigmas[0]) return 0.0;
    if (ls >= s->log_sigmas[LP_SD_TRAIN_STEPS - 1]) return LP_SD_TRAIN_STEPS - 1;
    int lo = 0, hi = LP_SD_TRAIN_STEPS - 1;
    while (hi - lo > 1) { /* log_sigmas increase */
        int mid = (lo + hi) / 2;
        if (s->log_sigmas[mid] <= ls) lo = mid;
        else hi = mid;
    }
    double w = (ls - s->log_sigmas[lo]) / (s->log_sigmas[hi] - s->log_sigmas[lo]);
    return lo + w;
}

double lp_sd_t_to_sigma(const lp_sd_schedule *s, double t) {
    if (t <= 0) return s->sigmas[0];
    if (t >= LP_SD_TRAIN_STEPS - 1) return s->sigmas[LP_SD_TRAIN_STEPS - 1];
    int lo = (int)floor(t);
    double w = t - lo;
    return exp((1 - w) * s->log_sigmas[lo] + w * s->log_sigmas[lo + 1]);
}

static const char *const sampler_names[] = {"euler", "euler_a", "ddim", "dpm++2m", "lcm"};

int lp_sd_sampler_parse(const char *name) {
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, sampler_names[i])) return i;
    return -1;
}

const char *lp_sd_sampler_name(int sampler) { return sampler >= 0 && sampler < 5 ? sampler_names[sampler] : "?"; }

int lp_sd_scheduler_parse(const char *name) {
    return !strcmp(name, "discrete") ? LP_SD_SCHED_DISCRETE : !strcmp(name, "karras") ? LP_SD_SCHED_KARRAS : -1;
}

int lp_sd_sigmas(const lp_sd_schedule *s, int sampler, int scheduler, int steps, double *out) {
    if (steps < 1 || steps > LP_SD_TRAIN_STEPS) return -1;
    if (sampler == LP_SD_SAMPLER_DDIM) {
        int stride = LP_SD_TRAIN_STEPS / steps;
        for (int i = 0; i < steps; i++) {
            int t = (steps - 1 - i) * stride + 1;
            if (t > LP_SD_TRAIN_STEPS - 1) t = LP_SD_TRAIN_STEPS - 1;
            out[i] = s->sigmas[t];
        }
    } else if (scheduler == LP_SD_SCHED_KARRAS) {
        double rho = 7.0, mn = pow(s->sigmas[0], 1 / rho), mx = pow(s->sigmas[LP_SD_TRAIN_STEPS - 1], 1 / rho);
        for (int i = 0; i < steps; i++) {
            double r = steps > 1 ? (double)i / (steps - 1) : 0.0;
            out[i] = pow(mx + r * (mn - mx), rho);
        }
    } else {
        for (int i = 0; i < steps; i++) {
            double t = steps > 1 ? (LP_SD_TRAIN_STEPS - 1) * (1.0 - (double)i / (steps - 1)) : LP_SD_TRAIN_STEPS - 1;
            out[i] = lp_sd_t_to_sigma(s, t);
        }
    }
    out[steps] = 0.0;
    return 0;
}

/* x[j] += scale * a normal draw, segment k of the n_rng equal segments drawing from rng[k] */
static void add_noise(float *x, int64_t n, double scale, lp_rng *rng, int n_rng) {
    int64_t seg = n / n_rng;
    for (int64_t j = 0; j < n; j++) x[j] += (float)scale * lp_rng_normal(&rng[j / seg]);
}

int lp_sd_sample(int sampler, const double *sigmas, int steps, float *x, int64_t n, lp_sd_denoise_fn fn, void *ctx,
                 lp_rng *rng, int n_rng, float *scratch, lp_sd_step_fn on_step, void *step_ctx, lp_error *err) {
    float *den = scratch, *old = scratch + n;
    if (n_rng < 1 || n % n_rng) return lp_fail(err, "sampler: %lld floats in %d noise streams", (long long)n, n_rng);
    for (int i = 0; i < steps; i++) {
        double s = sigmas[i], sn = sigmas[i + 1];
        if (fn(ctx, x, s, den, err)) return -1;
        switch (sampler) {
        case LP_SD_SAMPLER_EULER:
        case LP_SD_SAMPLER_DDIM:
            /* d = (x - D) / sigma; x += d (sigma_next - sigma) */
            for (int64_t j = 0; j < n; j++) x[j] = (float)(x[j] + (x[j] - den[j]) / s * (sn - s));
            break;
        case LP_SD_SAMPLER_EULER_A: {
            double up = 0.0;
            if (sn > 0) {
                up = sqrt(sn * sn * (s * s - sn * sn) / (s * s));
                if (up > sn) up = sn;
            }
            double down = sqrt(sn * sn - up * up);
            for (int64_t j = 0; j < n; j++) x[j] = (float)(x[j] + (x[j] - den[j]) / s * (down - s));
            if (up > 0) add_noise(x, n, up, rng, n_rng);
            break;
        }
        case LP_SD_SAMPLER_DPMPP_2M: {
            if (sn == 0) { /* the last step lands on the prediction */
                memcpy(x, den, sizeof(float) * (size_t)n);
            } else {
                double t = -log(s), tn = -log(sn), h = tn - t, a = sn / s, b = -expm1(-h);
                if (i == 0) {
                    for (int64_t j = 0; j < n; j++) x[j] = (float)(a * x[j] + b * den[j]);
                } else {
                    double r = (t + log(sigmas[i - 1])) / h; /* h_last / h */
                    double c1 = 1 + 1 / (2 * r), c0 = 1 / (2 * r);
                    for (int64_t j = 0; j < n; j++) x[j] = (float)(a * x[j] + b * (c1 * den[j] - c0 * old[j]));
                }
            }
            memcpy(old, den, sizeof(float) * (size_t)n);
            break;
        }
        case LP_SD_SAMPLER_LCM:
            memcpy(x, den, sizeof(float) * (size_t)n);
            if (sn > 0) add_noise(x, n, sn, rng, n_rng);
            break;
        default:
            return lp_fail(err, "unknown sampler %d", sampler);
        }
        if (on_step) on_step(step_ctx, i + 1, steps);
    }
    return 0;
}
