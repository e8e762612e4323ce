/* LORAPLEX_CPU, the cap on the kernel dispatch levels: its names (and that
 * anything else is refused, naming the accepted values), the levels each
 * cap this CPU supports leads to (through the environment too), and that
 * the integer matmul gives the C reference's bits under every cap: W4, W8
 * and W4C at groups 32 to 128, every batch from 1 to 17 rows and 64, 1 and
 * 2 threads. */
#include "check.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#include <stdlib.h>
#include <string.h>

/* Integer levels in cap order (LP_CPU_CAP_*): what each cap allows. */
static int int_rank(const lp_kernels *k) {
    switch (k->int_level) {
    case LP_INT_AVX2: return LP_CPU_CAP_AVX2;
    case LP_INT_AVXVNNI: return LP_CPU_CAP_AVXVNNI;
    case LP_INT_AVX512VNNI: return LP_CPU_CAP_AVX512VNNI;
    case LP_INT_AMX: return LP_CPU_CAP_AMX;
    case LP_INT_NEON_DOT: return k->i8mm ? LP_CPU_CAP_NEON_I8MM : LP_CPU_CAP_NEON_DOT;
    default: return LP_CPU_CAP_REFERENCE;
    }
}

static void test_names(void) {
    int cap = -7;
    const char *names = lp_cpu_cap_names();
    CHECK(lp_cpu_cap_parse("reference", &cap) == 0 && cap == LP_CPU_CAP_REFERENCE);
    CHECK(lp_cpu_cap_parse("Reference", &cap) == 0 && cap == LP_CPU_CAP_REFERENCE);
    CHECK(strstr(names, "reference") != NULL);
#if defined(__x86_64__)
    static const struct { const char *name; int cap; } ok[] = {
        {"amx", LP_CPU_CAP_AMX},          {"AMX-INT8", LP_CPU_CAP_AMX},      {"avx512-vnni", LP_CPU_CAP_AVX512VNNI},
        {"avx512vnni", LP_CPU_CAP_AVX512VNNI}, {"avx512", LP_CPU_CAP_AVX512}, {"avx2", LP_CPU_CAP_AVX2},
        {"avx-vnni", LP_CPU_CAP_AVXVNNI},  {"AVXVNNI", LP_CPU_CAP_AVXVNNI},  {"avx_vnni", LP_CPU_CAP_AVXVNNI},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cap = -7;
        CHECK_MSG(lp_cpu_cap_parse(ok[i].name, &cap) == 0 && cap == ok[i].cap, "%s", ok[i].name);
    }
    CHECK(strcmp(names, "amx, avx512-vnni, avx512, avx-vnni, avx2, reference") == 0);
    CHECK(lp_cpu_cap_parse("neon-dotprod", &cap) == -1); /* another architecture's */
#elif defined(__aarch64__)
    CHECK(lp_cpu_cap_parse("neon-dotprod", &cap) == 0 && cap == LP_CPU_CAP_NEON_DOT);
    CHECK(lp_cpu_cap_parse("neon-i8mm", &cap) == 0 && cap == LP_CPU_CAP_NEON_I8MM);
    CHECK(lp_cpu_cap_parse("I8MM", &cap) == 0 && cap == LP_CPU_CAP_NEON_I8MM);
    CHECK(strcmp(names, "neon-i8mm, neon-dotprod, reference") == 0);
    CHECK(lp_cpu_cap_parse("avx2", &cap) == -1);
#endif
    static const char *const bad[] = {"", "avx", "avx512-", "avx2 ", "sse4", "amx,avx2", "native"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK_MSG(lp_cpu_cap_parse(bad[i], &cap) == -1, "'%s'", bad[i]);

    /* the environment: unset / empty = no cap; a bad value is an error naming the accepted ones */
    lp_error err = {0};
    unsetenv(LP_CPU_ENV);
    CHECK(lp_cpu_cap_from_env(&cap, &err) == 0 && cap == LP_CPU_CAP_NONE);
    setenv(LP_CPU_ENV, "", 1);
    CHECK(lp_cpu_cap_from_env(&cap, &err) == 0 && cap == LP_CPU_CAP_NONE);
    setenv(LP_CPU_ENV, "avx9000", 1);
    CHECK(lp_cpu_cap_from_env(&cap, &err) == -1 && cap == LP_CPU_CAP_NONE);
    CHECK(strstr(err.message, "avx9000") && strstr(err.message, names));
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels k, native;
    lp_kernels_init(&k, &cpu); /* warns on stderr, runs uncapped */
    lp_kernels_init_capped(&native, &cpu, LP_CPU_CAP_NONE);
    CHECK(k.cpu_cap_invalid && k.cpu_cap == LP_CPU_CAP_NONE && k.int_level == native.int_level &&
          k.level == native.level);
    unsetenv(LP_CPU_ENV);
    lp_kernels_init(&k, &cpu);
    CHECK(!k.cpu_cap_invalid && k.cpu_cap == LP_CPU_CAP_NONE && k.int_level == native.int_level);
}

/* The caps this build knows, highest first. */
static int all_caps(int caps[8]) {
    int n = 0;
#if defined(__x86_64__)
    caps[n++] = LP_CPU_CAP_AMX;
    caps[n++] = LP_CPU_CAP_AVX512VNNI;
    caps[n++] = LP_CPU_CAP_AVX512;
    caps[n++] = LP_CPU_CAP_AVXVNNI;
    caps[n++] = LP_CPU_CAP_AVX2;
#elif defined(__aarch64__)
    caps[n++] = LP_CPU_CAP_NEON_I8MM;
    caps[n++] = LP_CPU_CAP_NEON_DOT;
#endif
    caps[n++] = LP_CPU_CAP_REFERENCE;
    return n;
}

/* Each cap gives the highest levels at or below both it and this CPU's,
 * the same through LORAPLEX_CPU, and a description that says so. */
static void test_levels(void) {
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_kernels native;
    lp_kernels_init_capped(&native, &cpu, LP_CPU_CAP_NONE);
    int caps[8], n = all_caps(caps);
    for (int i = 0; i < n; i++) {
        int cap = caps[i];
        lp_kernels k, e;
        lp_kernels_init_capped(&k, &cpu, cap);
        int top = int_rank(&native) < cap ? int_rank(&native) : cap;
#if defined(__x86_64__)
        /* x86 integer levels: reference, avx2, avx-vnni (the AVX-VNNI flag
         * without AVX-512 VNNI, or under its cap), avx512-vnni, amx; the
         * avx512 cap (AVX-512 CPUs without VNNI) takes avx2 */
        int want_int = top >= LP_CPU_CAP_AMX ? LP_INT_AMX
                       : top >= LP_CPU_CAP_AVX512VNNI ? LP_INT_AVX512VNNI
                       : top >= LP_CPU_CAP_AVXVNNI && top != LP_CPU_CAP_AVX512 && cpu.avxvnni ? LP_INT_AVXVNNI
                       : top >= LP_CPU_CAP_AVX2 ? LP_INT_AVX2 : LP_INT_REF;
        int float_cap = cap == LP_CPU_CAP_REFERENCE ? 0 : cap == LP_CPU_CAP_AVX2 || cap == LP_CPU_CAP_AVXVNNI ? 1 : 2;
#else
        int want_int = top == LP_CPU_CAP_REFERENCE ? LP_INT_REF : native.int_level;
        int float_cap = 0;
#endif
        int want_float = native.level < float_cap ? native.level : float_cap;
        CHECK_MSG(k.int_level == want_int && k.level == want_float && k.cpu_cap == cap,
                  "cap %s: levels %s / %d, expected %s / %d", lp_cpu_cap_name(cap), lp_int_level_name(k.int_level),
                  k.level, lp_int_level_name(want_int), want_float);
        if (cap == LP_CPU_CAP_REFERENCE)
            CHECK(k.dot_f32 == lp_dot_f32_ref && k.round_f16 == lp_round_f16 && !k.vbmi);
        setenv(LP_CPU_ENV, lp_cpu_cap_name(cap), 1);
        lp_kernels_init(&e, &cpu);
        CHECK(e.int_level == k.int_level && e.level == k.level && e.vbmi == k.vbmi && e.i8mm == k.i8mm &&
              e.cpu_cap == cap && !e.cpu_cap_invalid);
        CHECK_MSG(k.i8mm == (top == LP_CPU_CAP_NEON_I8MM), "cap %s: i8mm %d", lp_cpu_cap_name(cap), k.i8mm);
        char line[256];
        lp_kernels_describe(&k, line, sizeof line);
        bool lowered = k.int_level != native.int_level || k.level != native.level || k.vbmi != native.vbmi ||
                       k.i8mm != native.i8mm;
        CHECK_MSG(strncmp(line, lp_int_level_name(want_int), strlen(lp_int_level_name(want_int))) == 0 &&
                      (strstr(line, "capped by LORAPLEX_CPU=") != NULL) == lowered,
                  "cap %s: '%s'", lp_cpu_cap_name(cap), line);
        printf("cap %-12s -> %s\n", lp_cpu_cap_name(cap), line);
    }
    unsetenv(LP_CPU_ENV);
    char line[256];
    lp_kernels_describe(&native, line, sizeof line);
    CHECK(strstr(line, "LORAPLEX_CPU") == NULL);
}

static float *rand_normal(lp_rng *rng, int64_t n, float scale) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = lp_rng_normal(rng) * scale;
    return x;
}

typedef struct mm_case {
    uint32_t type;
    int group;
    int64_t rows, cols;
} mm_case;

/* Every cap's integer matmul (and lp_matmul_multi) against the reference
 * level's bits. */
static void test_bits(void) {
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    lp_error err;
    lp_threadpool *pool2 = lp_threadpool_create(2, &err);
    CHECK(pool2 != NULL);
    lp_rng rng;
    lp_rng_seed(&rng, 11);
    int caps[8], n_caps = all_caps(caps);
    lp_kernels ks[8];
    for (int i = 0; i < n_caps; i++) {
        lp_kernels_init_capped(&ks[i], &cpu, caps[i]);
        CHECK(lp_kernels_reserve(&ks[i], 64, 1024, &err) == 0);
    }
    lp_kernels ref;
    lp_kernels_init_reference(&ref);
    CHECK(lp_kernels_reserve(&ref, 64, 1024, &err) == 0);
    static const mm_case cases[] = {
        {LP_W4, 32, 80, 512}, {LP_W4, 64, 37, 256}, {LP_W4, 128, 16, 256}, {LP_W8, 32, 70, 256},
        {LP_W8, 96, 21, 96},  {LP_W4C, 32, 80, 512}, {LP_W4C, 64, 37, 192}, {LP_W4C, 128, 33, 256},
    };
    const int64_t max_b = 64, max_c = 512, max_r = 83;
    float *X = rand_normal(&rng, max_b * max_c, 1.0f);
    for (int64_t i = 0; i < max_b * max_c; i += 13) X[i] *= 30.0f; /* outliers */
    float *Y = malloc((size_t)(max_b * max_r) * sizeof(float)), *Y0 = malloc((size_t)(max_b * max_r) * sizeof(float));
    float *Y2 = malloc((size_t)(max_b * max_r) * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const mm_case *mc = &cases[c];
        float *wf = rand_normal(&rng, mc->rows * mc->cols, 0.05f);
        uint8_t *packed = malloc(lp_pack_bytes(mc->type, mc->rows, mc->cols, mc->group));
        CHECK(lp_pack_weight(mc->type, mc->group, wf, mc->rows, mc->cols, packed) == 0);
        lp_weight W = lp_packed_weight(mc->type, mc->group, mc->rows, mc->cols, packed);
        int64_t ys = mc->rows + 3;
        for (int64_t nb = 1; nb <= 18; nb++) {
            int64_t b = nb == 18 ? 64 : nb;
            lp_matmul(&ref, NULL, &W, X, mc->cols, b, Y0, ys);
            for (int i = 0; i < n_caps; i++)
                for (int threads = 1; threads <= 2; threads++) {
                    for (int64_t j = 0; j < b * ys; j++) Y[j] = 12345.0f;
                    lp_matmul(&ks[i], threads == 2 ? pool2 : NULL, &W, X, mc->cols, b, Y, ys);
                    int bad = 0, pad = 0;
                    for (int64_t bb = 0; bb < b; bb++)
                        for (int64_t r = 0; r < ys; r++) {
                            if (r >= mc->rows) pad += Y[bb * ys + r] != 12345.0f;
                            else bad += memcmp(&Y[bb * ys + r], &Y0[bb * ys + r], sizeof(float)) != 0;
                        }
                    CHECK_MSG(bad == 0 && pad == 0, "%s g%d %lldx%lld, %lld rows, cap %s (%s), %d threads: %d differ, %d padding writes",
                              lp_dtype_name(mc->type), mc->group, (long long)mc->rows, (long long)mc->cols, (long long)b,
                              lp_cpu_cap_name(caps[i]), lp_int_level_name(ks[i].int_level), threads, bad, pad);
                }
            /* the same weight twice in one lp_matmul_multi pass */
            if (b <= 16) {
                const lp_weight *Ws[2] = {&W, &W};
                for (int i = 0; i < n_caps; i++) {
                    float *Ys[2] = {Y, Y2};
                    int64_t yst[2] = {ys, ys};
                    lp_matmul_multi(&ks[i], pool2, 2, Ws, X, mc->cols, b, Ys, yst);
                    bool same = true;
                    for (int64_t bb = 0; bb < b; bb++)
                        same = same && memcmp(Y + bb * ys, Y0 + bb * ys, (size_t)mc->rows * sizeof(float)) == 0 &&
                               memcmp(Y2 + bb * ys, Y0 + bb * ys, (size_t)mc->rows * sizeof(float)) == 0;
                    CHECK_MSG(same, "%s g%d multi, %lld rows, cap %s differs", lp_dtype_name(mc->type), mc->group,
                              (long long)b, lp_cpu_cap_name(caps[i]));
                }
            }
        }
        free(wf);
        free(packed);
    }
    for (int i = 0; i < n_caps; i++) lp_kernels_free(&ks[i]);
    lp_kernels_free(&ref);
    lp_threadpool_destroy(pool2);
    free(X);
    free(Y);
    free(Y0);
    free(Y2);
}

int main(void) {
    test_names();
    test_levels();
    test_bits();
    return check_summary("cpucap");
}
