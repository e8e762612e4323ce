/* loraplex bench: speed and memory of the runtime, measured through the
 * public API only.
 *
 *   bench -m MODEL [-t 1,2]         load time, prefill and decode speed per
 *                                   thread count, against the memory roofline
 *                                   (a built-in read-bandwidth test)
 *   bench -m MODEL --streams 1,2,4  N variants decoded together over one shared
 *                                   prompt vs N runs one after another
 *   bench -m BASE --adapter-modes --adapters A1,A2,...
 *                                   the three ways to serve K tasks: K merged
 *                                   models, all adapters computed for every row
 *                                   (one-hot), and ours (each row only its own)
 *
 * Every timing is repeated -r times; tables show the median and the spread
 * (min..max). Tokens are random ids (speed does not depend on them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/base.h"
#include "../base/dtype.h"
#include "../runtime/context.h"
#include "../tools/adapter_write.h"
#include "cli.h"
#include "svg.h"
#include "tools.h"

int cli_bench(int argc, char **argv);
int cli_kernels_line(char *buf, size_t cap, lp_error *err); /* cli_model.c */

#define MAX_LIST 16
#define MAX_REPS 64
#define MAX_BENCH_ADAPTERS 64
#define MAX_MIXED 8

typedef struct bench_options {
    const char *model, *adapters, *svg;
    const char *profile;   /* --profile: a QUAD shared profile bound before the adapters */
    int prompt, n_gen, reps;
    int threads[MAX_LIST], n_threads;
    int streams[MAX_LIST], n_streams;
    int counts[MAX_LIST], n_counts;
    bool adapter_modes, adapter_cost, json, kv_f32;
    bool huge_pages; /* --huge-pages: a .lpx model read into 2 MiB pages (lp_model_params.huge_pages) */
    long bw_mib;
    char kernels[256]; /* the kernel levels in use (cli_kernels_line) */
} bench_options;

/* ---- measurements shared by the modes ------------------------------------------------ */

/* A "Key: N kB" line of a /proc file in bytes (0 where there is none). */
static uint64_t proc_kib_line(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    size_t n = strlen(key);
    uint64_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) {
            kib = strtoull(line + n, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return kib * 1024;
}

/* A "Vm...:" line of /proc/self/status in bytes. */
static uint64_t proc_status_bytes(const char *key) { return proc_kib_line("/proc/self/status", key); }

/* Bytes of this process's anonymous memory in 2 MiB pages. */
static uint64_t huge_page_bytes(void) { return proc_kib_line("/proc/self/smaps_rollup", "AnonHugePages:"); }

/* Peak resident set of this process in bytes (VmHWM, else ru_maxrss). */
static uint64_t peak_rss_bytes(void) {
    uint64_t bytes = proc_status_bytes("VmHWM:");
    if (!bytes) {
        struct rusage ru;
        if (!getrusage(RUSAGE_SELF, &ru)) bytes = (uint64_t)ru.ru_maxrss * 1024;
    }
    return bytes;
}

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
}

typedef struct embd_probe {
    uint64_t bytes;
} embd_probe;

static void find_embedding(void *user, const char *name, const char *type, int64_t rows,
                           int64_t cols) {
    embd_probe *p = user;
    if (strcmp(name, "token_embd") || rows < 0 || cols < 0) return;
    for (uint32_t id = 0; id < LP_DTYPE_OWN_END; id++) {
        const char *n = lp_dtype_name(id);
        if (n && !strcmp(n, type)) {
            p->bytes = (uint64_t)lp_dtype_row_bytes(id, (uint64_t)cols) * (uint64_t)rows;
            return;
        }
    }
}

/* Bytes of weights streamed from memory per decoded token: every matrix,
 * except that only one row of the token embedding is read (unless it is
 * also the output matrix). */
static uint64_t weight_bytes_per_token(const lp_model *model) {
    lp_model_info info;
    lp_model_get_info(model, &info);
    if (info.tied_output) return info.weight_bytes;
    embd_probe p = {0};
    lp_model_foreach_weight(model, find_embedding, &p);
    return p.bytes < info.weight_bytes ? info.weight_bytes - p.bytes : info.weight_bytes;
}

static void random_tokens(const lp_model *model, uint64_t seed, int32_t *out, int n) {
    lp_model_info info;
    lp_model_get_info(model, &info);
    lp_rng rng;
    lp_rng_seed(&rng, seed);
    /* skip the first ids: control tokens in most vocabularies */
    int lo = info.n_vocab > 16 ? 3 : 0;
    for (int i = 0; i < n; i++)
        out[i] = lo + (int32_t)(lp_rng_u64(&rng) % (uint64_t)(info.n_vocab - lo));
}

/* Time of one engine run: until every request has its first token (the
 * prefill, one step for a prompt of up to max_rows tokens) and for the
 * decode steps after it. */
typedef struct engine_timing {
    double prefill_s, decode_s;
    int decode_steps;
} engine_timing;

/* n_seqs requests, the i-th a prompt of n_prompt random tokens (seed + i)
 * under the adapter bound to slots[i], each generating n_gen tokens
 * greedily (end of text ignored), all through one engine. */
static int engine_generate(lp_context *ctx, const int *slots, int n_seqs, int n_prompt, int n_gen,
                           uint64_t seed, engine_timing *t, lp_error *err) {
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    int ids[MAX_MIXED];
    lp_engine *e = prompt ? lp_engine_create(ctx, NULL, err) : NULL;
    int rc = -1;
    if (!e) goto done;
    for (int i = 0; i < n_seqs; i++) {
        random_tokens(lp_context_model(ctx), seed + (uint64_t)i, prompt, n_prompt);
        lp_request q = lp_request_default();
        q.prompt = prompt;
        q.n_prompt = n_prompt;
        q.adapter = lp_context_slot_adapter(ctx, slots[i]);
        q.sampling.temperature = 0;
        q.sampling.repeat_penalty = 1.0f;
        q.max_tokens = n_gen;
        q.stop_at_eog = false;
        q.no_reuse = q.drop_kv = true;
        if ((ids[i] = lp_engine_submit(e, &q, err)) < 0) goto done;
    }
    *t = (engine_timing){0};
    double t0 = lp_now_seconds(), t1 = 0;
    for (int left = 1; left > 0;) {
        if ((left = lp_engine_step(e, err)) < 0) goto done;
        if (t1 > 0) {
            t->decode_steps++;
            continue;
        }
        bool all = true;
        for (int i = 0; i < n_seqs; i++) {
            lp_request_stats st;
            lp_engine_request_stats(e, ids[i], &st);
            all &= st.n_generated > 0;
        }
        if (all) t1 = lp_now_seconds();
    }
    t->prefill_s = t1 - t0;
    t->decode_s = lp_now_seconds() - t1;
    rc = 0;
done:
    if (!prompt) lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    lp_engine_free(e);
    free(prompt);
    return rc;
}

/* Decode speed of n_seqs sequences with the given adapter slots: each a
 * prompt of n_prompt random tokens with its adapter, then n_steps tokens.
 * Returns tokens per second of the decode steps over all sequences, or -1. */
static double decode_speed(lp_context *ctx, const int *slots, int n_seqs, int n_prompt, int n_steps,
                           uint64_t seed, lp_error *err) {
    engine_timing t;
    if (engine_generate(ctx, slots, n_seqs, n_prompt, n_steps + 1, seed, &t, err)) return -1;
    return t.decode_s > 0 ? (double)n_seqs * t.decode_steps / t.decode_s : -1;
}

/* ---- machine read bandwidth ------------------------------------------------------------- */

/* Sums the buffer as 64-bit lanes with wide loads and four independent
 * accumulators; the compiler turns the vector types into SSE/AVX2/AVX-512
 * loads per the target attribute. The sum is returned so it is not elided. */
typedef uint64_t u64x4 __attribute__((vector_size(32), may_alias));

/* One body, stamped out per target: four independent accumulators over
 * `vec` lanes, reduced at the end. */
#define DEFINE_SUM(name, attr, vec, lanes)                                   \
    attr static uint64_t name(const uint8_t *p, size_t n) {                  \
        const vec *v = (const vec *)(const void *)p;                         \
        size_t n_vec = n / sizeof(vec);                                      \
        vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                          \
        for (size_t i = 0; i + 4 <= n_vec; i += 4) {                         \
            a0 += v[i];                                                      \
            a1 += v[i + 1];                                                  \
            a2 += v[i + 2];                                                  \
            a3 += v[i + 3];                                                  \
        }                                                                    \
        vec s = a0 + a1 + a2 + a3;                                           \
        uint64_t t = 0;                                                      \
        for (int i = 0; i < (lanes); i++) t += s[i];                         \
        return t;                                                            \
    }

DEFINE_SUM(sum_generic, , u64x4, 4)
#if defined(__x86_64__)
typedef uint64_t u64x8 __attribute__((vector_size(64), may_alias));
DEFINE_SUM(sum_avx2, __attribute__((target("avx2"))), u64x4, 4)
DEFINE_SUM(sum_avx512, __attribute__((target("avx512f"))), u64x8, 8)
#endif

typedef uint64_t (*sum_fn)(const uint8_t *, size_t);

typedef struct bw_task {
    const uint8_t *buf;
    size_t bytes;
    sum_fn sum;
    uint64_t sink[256];
} bw_task;

static void bw_worker(void *user, int ti, int nt) {
    bw_task *t = user;
    int64_t begin, end;
    /* chunks of 256 bytes: a whole number of iterations of the widest loop */
    lp_split_range((int64_t)(t->bytes / 256), ti, nt, 64, &begin, &end);
    t->sink[ti & 255] = t->sum(t->buf + (size_t)begin * 256, (size_t)(end - begin) * 256);
}

static void bw_fill(void *user, int ti, int nt) {
    bw_task *t = user;
    int64_t begin, end;
    lp_split_range((int64_t)(t->bytes / 8), ti, nt, 512, &begin, &end);
    uint64_t *w = (uint64_t *)(void *)t->buf; /* the buffer is ours and 64-byte aligned */
    for (int64_t i = begin; i < end; i++) w[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

/* The read-bandwidth test: a buffer of `mib` MiB, written once (untouched
 * pages would all map the one zero page), and its own pool. */
typedef struct bw_test {
    bw_task task;
    uint8_t *buf; /* task.buf, owned */
    lp_threadpool *pool;
} bw_test;

static void bw_test_free(bw_test *b) {
    lp_threadpool_destroy(b->pool);
    lp_free(b->buf);
    memset(b, 0, sizeof *b);
}

static int bw_test_create(bw_test *b, int n_threads, size_t mib, lp_error *err) {
    memset(b, 0, sizeof *b);
    b->task.bytes = mib << 20;
    b->task.buf = b->buf = lp_alloc(b->task.bytes);
    b->pool = lp_threadpool_create(n_threads, err);
    if (!b->buf || !b->pool) {
        bool no_buf = !b->buf;
        bw_test_free(b);
        return no_buf ? lp_fail(err, "cannot allocate %zu MiB for the bandwidth test", mib) : -1;
    }
    b->task.sum = sum_generic;
#if defined(__x86_64__)
    lp_cpu_features cpu;
    lp_cpu_detect(&cpu);
    if (cpu.avx512f) b->task.sum = sum_avx512;
    else if (cpu.avx2) b->task.sum = sum_avx2;
#endif
    lp_threadpool_run(b->pool, bw_fill, &b->task);
    lp_threadpool_run(b->pool, bw_worker, &b->task); /* warm-up */
    return 0;
}

/* Read bandwidth in GB/s (1e9 bytes), one value per pass. */
static void bw_test_run(bw_test *b, int passes, double *gbps) {
    for (int p = 0; p < passes; p++) {
        double t0 = lp_now_seconds();
        lp_threadpool_run(b->pool, bw_worker, &b->task);
        gbps[p] = (double)b->task.bytes / (lp_now_seconds() - t0) / 1e9;
    }
}

/* ---- mode 1: speed per thread count ------------------------------------------------------- */

typedef struct speed_result {
    int threads;
    tool_summary load_ms, prefill, decode, bw, roofline;
} speed_result;

/* Read-test passes right after each repetition's decode: the machine's
 * bandwidth drifts by 10 % within minutes, so each decode is compared
 * with a read test taken seconds after it, not with one taken later. */
#define BW_PASSES 2

static void print_summary_json(const char *key, tool_summary s) {
    printf(",\"%s\":%.6g,\"%s_min\":%.6g,\"%s_max\":%.6g", key, s.median, key, s.min, key, s.max);
}

static int bench_speed(const bench_options *o) {
    lp_error err = {0};
    speed_result res[MAX_LIST];
    uint64_t model_bytes = file_bytes(o->model), wbpt = 0;
    lp_model_info info = {0};
    char model_name[128] = ""; /* info's strings die with the model */
    uint64_t rss = 0, huge = 0;
    const lp_model_params mp = {.huge_pages = o->huge_pages};
    for (int ti = 0; ti < o->n_threads; ti++) {
        double load[MAX_REPS], pre[MAX_REPS], dec[MAX_REPS];
        double bw_all[MAX_REPS * BW_PASSES] = {0}, roof[MAX_REPS] = {0};
        int threads = o->threads[ti] ? o->threads[ti] : lp_default_threads();
        for (int r = 0; r < o->reps; r++) {
            double t0 = lp_now_seconds();
            lp_model *model = lp_model_load(o->model, &mp, &err);
            lp_context *ctx = NULL;
            if (model) {
                lp_context_params cp = lp_context_default_params();
                cp.n_threads = threads;
                cp.kv_f32 = o->kv_f32;
                cp.max_rows = o->prompt;
                cp.max_sequences = 1;
                cp.n_ctx = cp.max_seq_len = o->prompt + o->n_gen + 16;
                ctx = lp_context_create(model, &cp, &err);
            }
            load[r] = (lp_now_seconds() - t0) * 1e3;
            if (!ctx) {
                lp_model_free(model);
                return cli_fail(o->model, &err);
            }
            lp_model_get_info(model, &info);
            snprintf(model_name, sizeof model_name, "%s",
                     info.name && info.name[0] ? info.name : info.arch);
            wbpt = weight_bytes_per_token(model);
            if (!model_bytes) model_bytes = info.weight_bytes;
            /* one untimed pass first, as llama-bench does: the first touches
             * every mapped weight page and planned buffer (page faults) */
            int base = 0;
            engine_timing et = {0};
            uint64_t seed = 1234 + (uint64_t)r;
            int rc = engine_generate(ctx, &base, 1, o->prompt, 2, seed, &et, &err);
            if (rc == 0) rc = engine_generate(ctx, &base, 1, o->prompt, o->n_gen + 1, seed, &et, &err);
            pre[r] = o->prompt / et.prefill_s;
            double s = rc ? -1 : et.decode_s;
            dec[r] = et.decode_steps / s;
            /* the model and every planned buffer are resident now, and the
             * read test's buffer is not (it comes and goes below) */
            uint64_t resident = proc_status_bytes("VmRSS:");
            if (resident > rss) rss = resident;
            uint64_t in_huge = huge_page_bytes();
            if (in_huge > huge) huge = in_huge;
            lp_context_free(ctx);
            lp_model_free(model);
            if (rc || s < 0) return cli_fail("forward", &err);
            if (o->bw_mib > 0) {
                bw_test bw;
                if (bw_test_create(&bw, threads, (size_t)o->bw_mib, &err)) return cli_fail("bandwidth test", &err);
                double *gbps = bw_all + r * BW_PASSES;
                bw_test_run(&bw, BW_PASSES, gbps);
                bw_test_free(&bw);
                double mean = 0;
                for (int p = 0; p < BW_PASSES; p++) mean += gbps[p] / BW_PASSES;
                roof[r] = (double)wbpt * dec[r] / 1e9 / mean;
            }
        }
        res[ti].threads = threads;
        res[ti].load_ms = tool_summarize(load, o->reps);
        res[ti].prefill = tool_summarize(pre, o->reps);
        res[ti].decode = tool_summarize(dec, o->reps);
        res[ti].bw = tool_summarize(bw_all, o->bw_mib > 0 ? o->reps * BW_PASSES : 1);
        res[ti].roofline = tool_summarize(roof, o->bw_mib > 0 ? o->reps : 1);
    }
    if (!rss) rss = peak_rss_bytes();
    if (!o->json) {
        printf("kernels: %s\n", o->kernels);
        printf("model %s: %s, %.1f MiB file, %.1f MiB weights read per token, peak RSS %.1f MiB "
               "(%.1f MiB in 2 MiB pages%s)\n",
               o->model, model_name, model_bytes / 1048576.0, wbpt / 1048576.0, rss / 1048576.0,
               huge / 1048576.0, o->huge_pages ? ", --huge-pages" : "");
        printf("prompt %d tokens, %d decoded, %d runs: median (min..max)\n", o->prompt, o->n_gen,
               o->reps);
        printf("%-7s | %-22s | %-24s | %-22s | %-8s | %-18s | %s\n", "threads", "load ms",
               "prefill tok/s", "decode tok/s", "GB/s eff", "machine read GB/s", "roofline");
    }
    for (int ti = 0; ti < o->n_threads; ti++) {
        const speed_result *r = &res[ti];
        double eff = (double)wbpt * r->decode.median / 1e9;
        double frac = r->roofline.median;
        if (o->json) {
            printf("{\"model\":");
            tool_json_string(stdout, o->model);
            printf(",\"threads\":%d,\"prompt_tokens\":%d,\"decode_tokens\":%d,\"reps\":%d",
                   r->threads, o->prompt, o->n_gen, o->reps);
            print_summary_json("load_ms", r->load_ms);
            print_summary_json("prefill_tok_s", r->prefill);
            print_summary_json("decode_tok_s", r->decode);
            print_summary_json("machine_read_GBps", r->bw);
            print_summary_json("roofline_fraction", r->roofline);
            printf(",\"model_bytes\":%llu,\"weight_bytes_per_token\":%llu,"
                   "\"peak_rss_bytes\":%llu,\"huge_page_bytes\":%llu,\"huge_pages\":%s,\"decode_GBps\":%.4g}\n",
                   (unsigned long long)model_bytes, (unsigned long long)wbpt,
                   (unsigned long long)rss, (unsigned long long)huge, o->huge_pages ? "true" : "false", eff);
        } else {
            printf("%-7d | %7.1f (%6.1f..%6.1f) | %7.1f (%6.1f..%7.1f) | %6.2f (%6.2f..%6.2f) | "
                   "%8.2f | %5.1f (%5.1f..%5.1f) | %5.1f %%\n",
                   r->threads, r->load_ms.median, r->load_ms.min, r->load_ms.max,
                   r->prefill.median, r->prefill.min, r->prefill.max, r->decode.median,
                   r->decode.min, r->decode.max, eff, r->bw.median, r->bw.min, r->bw.max,
                   100 * frac);
        }
    }
    return 0;
}

/* ---- shared setup for the streams and adapter modes ------------------------------------- */

typedef struct bench_env {
    lp_model *model;
    lp_profile *profile;
    lp_adapter *adapters[MAX_BENCH_ADAPTERS];
    const char *adapter_paths[MAX_BENCH_ADAPTERS];
    int n_adapters;
    char *adapter_list;
    double load_ms;
    tool_summary adapter_load_ms;
} bench_env;

static void env_free(bench_env *e) {
    for (int i = 0; i < e->n_adapters; i++) lp_adapter_free(e->adapters[i]);
    lp_profile_free(e->profile);
    lp_model_free(e->model);
    free(e->adapter_list);
}

static int env_load(bench_env *e, const bench_options *o, lp_error *err) {
    memset(e, 0, sizeof *e);
    double t0 = lp_now_seconds();
    const lp_model_params mp = {.huge_pages = o->huge_pages};
    if (!(e->model = lp_model_load(o->model, &mp, err))) return lp_fail_prefix(err, "%s", o->model);
    e->load_ms = (lp_now_seconds() - t0) * 1e3;
    if (o->profile && !(e->profile = lp_profile_load(e->model, o->profile, err))) return -1;
    if (!o->adapters) return 0;
    if (!(e->adapter_list = strdup(o->adapters))) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    double ms[MAX_BENCH_ADAPTERS];
    for (char *p = e->adapter_list; p && *p;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (e->n_adapters == MAX_BENCH_ADAPTERS)
            return lp_fail(err, "at most %d adapters", MAX_BENCH_ADAPTERS);
        double ta = lp_now_seconds();
        lp_adapter *a = lp_adapter_load(e->model, p, 1.0f, err);
        if (!a) return lp_fail_prefix(err, "%s", p);
        ms[e->n_adapters] = (lp_now_seconds() - ta) * 1e3;
        e->adapter_paths[e->n_adapters] = p;
        e->adapters[e->n_adapters++] = a;
        p = comma ? comma + 1 : NULL;
    }
    e->adapter_load_ms = tool_summarize(ms, e->n_adapters < 64 ? e->n_adapters : 64);
    return 0;
}

static int bind_first(lp_context *ctx, bench_env *e, int k, int max_slots, lp_error *err) {
    if (e->profile && lp_context_bind_profile(ctx, e->profile, err)) return -1;
    for (int s = 1; s <= max_slots; s++)
        if (lp_context_bind_adapter(ctx, s, s <= k ? e->adapters[s - 1] : NULL, err)) return -1;
    return 0;
}

/* ---- mode 2: concurrent streams vs sequential runs ---------------------------------------- */

typedef struct kv_probe {
    const lp_context *ctx;
    int peak_blocks;
} kv_probe;

static bool track_kv(void *user, int stream, const char *text, size_t len) {
    kv_probe *p = user;
    int used, total, bt;
    lp_kv_usage(p->ctx, &used, &total, &bt);
    if (used > p->peak_blocks) p->peak_blocks = used;
    return true;
}

typedef struct streams_run {
    double seconds, step_ms;
    int peak_blocks;
} streams_run;

/* One timed lp_generate_streams of streams[0..n) over the prompt. */
static int run_streams(lp_context *ctx, const int32_t *prompt, int n_prompt, lp_stream *streams,
                       int n, int first_seq, int n_gen, streams_run *out, lp_error *err) {
    lp_generate_params gp = lp_generate_default_params();
    gp.n_predict = n_gen;
    gp.stop_at_eog = false;
    gp.reuse_cache = false;
    gp.first_seq = first_seq;
    gp.prefix_adapter = 0;
    kv_probe probe = {ctx, 0};
    lp_generate_stats st;
    for (int i = 0; i < n; i++) lp_sampler_reset(streams[i].sampler, 1000 + (uint64_t)i);
    double t0 = lp_now_seconds();
    if (lp_generate_streams(ctx, prompt, n_prompt, streams, n, &gp, track_kv, &probe, NULL, &st,
                            err))
        return -1;
    out->seconds = lp_now_seconds() - t0;
    out->step_ms = st.decode_steps > 0 ? st.decode_seconds * 1e3 / st.decode_steps : 0;
    out->peak_blocks = probe.peak_blocks;
    return 0;
}

typedef struct streams_point {
    int n;
    tool_summary conc_ms, seq_ms, step_ms;
    int conc_blocks, seq_blocks;
} streams_point;

static int streams_measure(lp_context *ctx, const int32_t *prompt, const bench_options *o,
                           lp_stream *streams, int n, int max_seqs, bool sequential,
                           streams_point *pt, lp_error *err) {
    double conc[MAX_REPS], seq[MAX_REPS], step[MAX_REPS];
    memset(pt, 0, sizeof *pt);
    pt->n = n;
    for (int r = 0; r < o->reps; r++) {
        streams_run run;
        for (int s = 0; s < max_seqs; s++) lp_seq_clear(ctx, s);
        if (run_streams(ctx, prompt, o->prompt, streams, n, 0, o->n_gen, &run, err)) return -1;
        conc[r] = run.seconds * 1e3;
        step[r] = run.step_ms;
        if (run.peak_blocks > pt->conc_blocks) pt->conc_blocks = run.peak_blocks;
        seq[r] = 0;
        for (int i = 0; sequential && i < n; i++) {
            for (int s = 0; s < max_seqs; s++) lp_seq_clear(ctx, s);
            if (run_streams(ctx, prompt, o->prompt, &streams[i], 1, 0, o->n_gen, &run, err))
                return -1;
            seq[r] += run.seconds * 1e3;
            if (run.peak_blocks > pt->seq_blocks) pt->seq_blocks = run.peak_blocks;
        }
    }
    pt->conc_ms = tool_summarize(conc, o->reps);
    pt->seq_ms = tool_summarize(seq, o->reps);
    pt->step_ms = tool_summarize(step, o->reps);
    return 0;
}

static int streams_svg(const bench_options *o, const streams_point *pts, int n, double block_mib,
                       lp_error *err) {
    double x[MAX_LIST], conc[MAX_LIST], seq[MAX_LIST], step[MAX_LIST], kv_c[MAX_LIST],
        kv_s[MAX_LIST];
    for (int i = 0; i < n; i++) {
        x[i] = pts[i].n;
        conc[i] = pts[i].conc_ms.median / 1e3;
        seq[i] = pts[i].seq_ms.median / 1e3;
        step[i] = pts[i].step_ms.median;
        kv_c[i] = pts[i].conc_blocks * block_mib;
        kv_s[i] = pts[i].seq_blocks * block_mib;
    }
    const char *lat_names[] = {"concurrent (one batch per step)", "sequential (N runs)"};
    const double *lat_y[] = {conc, seq};
    const char *step_names[] = {"decode step"};
    const double *step_y[] = {step};
    const char *mem_names[] = {"concurrent (peak)", "one run at a time (peak)"};
    const double *mem_y[] = {kv_c, kv_s};
    svg_chart charts[3] = {
        {"Time to finish N streams", "streams N", "seconds", false, true, n, x, NULL, 2,
         lat_names, lat_y},
        {"Decode step time", "streams N", "ms per step", false, true, n, x, NULL, 1, step_names,
         step_y},
        {"KV cache in use", "streams N", "MiB", false, true, n, x, NULL, 2, mem_names, mem_y},
    };
    return svg_save(o->svg, charts, 3, err);
}

static int bench_streams(const bench_options *o) {
    lp_error err = {0};
    bench_env e;
    int rc = 1, max_n = 0;
    lp_context *ctx = NULL;
    lp_sampler *samplers[64] = {0};
    lp_stream streams[64];
    int32_t *prompt = malloc((size_t)o->prompt * sizeof *prompt);
    streams_point pts[MAX_LIST], mix[3];
    int n_mix = 0;
    memset(&e, 0, sizeof e);
    for (int i = 0; i < o->n_streams; i++)
        if (o->streams[i] > max_n) max_n = o->streams[i];
    if (!prompt) goto out;
    if (env_load(&e, o, &err)) {
        rc = cli_fail("bench", &err);
        goto out;
    }
    if (e.n_adapters > max_n) max_n = e.n_adapters;
    if (max_n > 64) {
        fprintf(stderr, "loraplex bench: at most 64 streams\n");
        goto out;
    }
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o->threads[0];
    cp.kv_f32 = o->kv_f32;
    cp.max_sequences = max_n;
    cp.max_rows = o->prompt > max_n ? o->prompt : max_n;
    cp.max_logit_rows = max_n;
    cp.max_seq_len = o->prompt + o->n_gen + 16;
    cp.n_ctx = o->prompt + max_n * (o->n_gen + 64) + 64;
    cp.max_adapters = e.n_adapters > 0 ? e.n_adapters : 1;
    if (!(ctx = lp_context_create(e.model, &cp, &err))) {
        rc = cli_fail("context", &err);
        goto out;
    }
    if (e.profile && lp_context_bind_profile(ctx, e.profile, &err)) {
        rc = cli_fail(o->profile, &err);
        goto out;
    }
    for (int i = 0; i < e.n_adapters; i++)
        if (lp_context_bind_adapter(ctx, i + 1, e.adapters[i], &err)) {
            rc = cli_fail(e.adapter_paths[i], &err);
            goto out;
        }
    lp_sampler_params sp = lp_sampler_default_params();
    sp.temperature = 0.8f;
    for (int i = 0; i < max_n; i++) {
        sp.seed = 1000 + (uint64_t)i;
        if (!(samplers[i] = lp_sampler_create(e.model, &sp, &err))) {
            rc = cli_fail("sampler", &err);
            goto out;
        }
        streams[i] = (lp_stream){NULL, 0, samplers[i], -1};
    }
    random_tokens(e.model, 42, prompt, o->prompt);
    streams_run warm; /* untimed: first touches of the weights and scratch */
    if (run_streams(ctx, prompt, o->prompt, streams, 1, 0, o->n_gen, &warm, &err)) {
        rc = cli_fail("streams", &err);
        goto out;
    }
    for (int k = 0; k < o->n_streams; k++)
        if (streams_measure(ctx, prompt, o, streams, o->streams[k], max_n, true, &pts[k], &err)) {
            rc = cli_fail("streams", &err);
            goto out;
        }
    if (e.n_adapters > 0) {
        /* the same N streams three ways: own adapters, all adapter 1, no adapter */
        int n = e.n_adapters;
        for (int mode = 0; mode < 3; mode++) {
            for (int i = 0; i < n; i++) streams[i].adapter = mode == 0 ? i + 1 : mode == 1 ? 1 : 0;
            if (streams_measure(ctx, prompt, o, streams, n, max_n, mode == 0, &mix[mode], &err)) {
                rc = cli_fail("streams with adapters", &err);
                goto out;
            }
        }
        n_mix = 3;
        for (int i = 0; i < n; i++) streams[i].adapter = 0;
    }
    double block_mib = lp_kv_block_bytes(ctx) / 1048576.0;
    lp_model_info info;
    lp_model_get_info(e.model, &info);
    static const char *const mix_names[3] = {"own adapter each", "all adapter 1", "base only"};
    if (o->json) {
        for (int k = 0; k < o->n_streams + n_mix; k++) {
            const streams_point *p = k < o->n_streams ? &pts[k] : &mix[k - o->n_streams];
            printf("{\"streams\":%d,\"prompt_tokens\":%d,\"tokens_per_stream\":%d,\"threads\":%d",
                   p->n, o->prompt, o->n_gen, o->threads[0] ? o->threads[0] : lp_default_threads());
            if (k >= o->n_streams) {
                printf(",\"adapters\":");
                tool_json_string(stdout, mix_names[k - o->n_streams]);
            }
            print_summary_json("concurrent_ms", p->conc_ms);
            if (k < o->n_streams || k == o->n_streams) {
                print_summary_json("sequential_ms", p->seq_ms);
                printf(",\"speedup\":%.4g", p->seq_ms.median / p->conc_ms.median);
            }
            print_summary_json("step_ms", p->step_ms);
            printf(",\"kv_bytes\":%llu,\"model_bytes\":%llu}\n",
                   (unsigned long long)(p->conc_blocks * lp_kv_block_bytes(ctx)),
                   (unsigned long long)info.weight_bytes);
        }
    } else {
        printf("kernels: %s\n", o->kernels);
        printf("%d prompt tokens, %d tokens per stream, %d runs: median (min..max)\n", o->prompt,
               o->n_gen, o->reps);
        printf("%-3s | %-26s | %-26s | %-7s | %-22s | %-9s | %s\n", "N", "concurrent ms",
               "sequential ms", "speedup", "step ms", "KV MiB", "KV+model MiB");
        for (int k = 0; k < o->n_streams; k++) {
            const streams_point *p = &pts[k];
            printf("%-3d | %8.1f (%7.1f..%7.1f) | %8.1f (%7.1f..%7.1f) | %6.2fx | "
                   "%6.2f (%6.2f..%6.2f) | %9.2f | %9.1f\n",
                   p->n, p->conc_ms.median, p->conc_ms.min, p->conc_ms.max, p->seq_ms.median,
                   p->seq_ms.min, p->seq_ms.max, p->seq_ms.median / p->conc_ms.median,
                   p->step_ms.median, p->step_ms.min, p->step_ms.max, p->conc_blocks * block_mib,
                   p->conc_blocks * block_mib + info.weight_bytes / 1048576.0);
        }
        for (int m = 0; m < n_mix; m++)
            printf("%d streams, %-17s: concurrent %.1f ms (%.1f..%.1f), step %.2f ms\n",
                   mix[m].n, mix_names[m], mix[m].conc_ms.median, mix[m].conc_ms.min,
                   mix[m].conc_ms.max, mix[m].step_ms.median);
        if (n_mix)
            printf("%d streams with their own adapters one after another: %.1f ms (%.1f..%.1f)\n",
                   mix[0].n, mix[0].seq_ms.median, mix[0].seq_ms.min, mix[0].seq_ms.max);
    }
    if (o->svg && streams_svg(o, pts, o->n_streams, block_mib, &err)) {
        rc = cli_fail("svg", &err);
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < 64; i++) lp_sampler_free(samplers[i]);
    lp_context_free(ctx);
    env_free(&e);
    free(prompt);
    return rc;
}

/* ---- mode 3: merged models vs one-hot vs runtime adapters -------------------------------- */

typedef struct modes_point {
    int k;
    uint64_t adapters_bytes;
    tool_summary onehot_tok_s, ours_tok_s;
} modes_point;

static tool_summary repeat_decode(lp_context *ctx, const int *adapters, int n_seqs,
                                  const bench_options *o, lp_error *err, bool *failed) {
    double v[MAX_REPS];
    for (int r = 0; r < o->reps; r++) {
        v[r] = decode_speed(ctx, adapters, n_seqs, o->prompt, o->n_gen, 7 + (uint64_t)r, err);
        if (v[r] < 0) *failed = true;
    }
    return tool_summarize(v, o->reps);
}

/* ns per lp_context_bind_adapter call (alternating two adapters on slot 1). */
static double bind_ns(lp_context *ctx, bench_env *e, lp_error *err) {
    const int n = 200000;
    double t0 = lp_now_seconds();
    for (int i = 0; i < n; i++)
        if (lp_context_bind_adapter(ctx, 1, e->adapters[i % 2 ? (e->n_adapters > 1) : 0], err))
            return -1;
    double ns = (lp_now_seconds() - t0) * 1e9 / n;
    lp_context_bind_adapter(ctx, 1, e->adapters[0], err);
    return ns;
}

static int modes_svg(const bench_options *o, const modes_point *pts, int n, double model_mib,
                     double base_tok_s, const tool_summary *mixed, lp_error *err) {
    char labels[MAX_LIST][16];
    const char *cats[MAX_LIST];
    double mem_m[MAX_LIST], mem_o[MAX_LIST], tok_m[MAX_LIST], tok_h[MAX_LIST], tok_o[MAX_LIST];
    for (int i = 0; i < n; i++) {
        snprintf(labels[i], sizeof labels[i], "K=%d", pts[i].k);
        cats[i] = labels[i];
        mem_m[i] = pts[i].k * model_mib / 1024;
        mem_o[i] = (model_mib + pts[i].adapters_bytes / 1048576.0) / 1024;
        tok_m[i] = base_tok_s;
        tok_h[i] = pts[i].onehot_tok_s.median;
        tok_o[i] = pts[i].ours_tok_s.median;
    }
    const char *mem_names[] = {"K merged models", "base + K adapters (one-hot, ours)"};
    const double *mem_y[] = {mem_m, mem_o};
    const char *tok_names[] = {"merged (= base)", "one-hot, all K computed", "ours, own adapter"};
    const double *tok_y[] = {tok_m, tok_h, tok_o};
    const char *mix_cats[] = {"8 adapters", "1 adapter", "base"};
    double mix_v[3] = {mixed[0].median, mixed[1].median, mixed[2].median};
    const char *mix_names[] = {"8 sequences, decode tok/s"};
    const double *mix_y[] = {mix_v};
    svg_chart charts[3] = {
        {"Memory for K tasks", "tasks K", "GiB", true, false, n, NULL, cats, 2, mem_names, mem_y},
        {"Decode speed, one sequence", "tasks K", "tokens/s", true, false, n, NULL, cats, 3,
         tok_names, tok_y},
        {"Mixed batch of 8 sequences", "adapters in the batch", "tokens/s", true, false, 3, NULL,
         mix_cats, 1, mix_names, mix_y},
    };
    return svg_save(o->svg, charts, 3, err);
}

/* The first k adapters stacked into one (lp_adapter_write_concat), via a
 * temporary .lpa. */
static lp_adapter *all_adapters(const bench_env *e, int k, lp_error *err) {
    char path[] = "/tmp/loraplex-bench-all-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        lp_error_set(err, LP_ERR_IO, "cannot create a temporary file");
        return NULL;
    }
    close(fd);
    lp_adapter *a = NULL;
    if (lp_adapter_write_concat((const lp_adapter *const *)e->adapters, k, path, err) == 0)
        a = lp_adapter_load(e->model, path, 1.0f, err);
    remove(path);
    return a;
}

static int bench_adapter_modes(const bench_options *o) {
    lp_error err = {0};
    bench_env e;
    int rc = 1, max_k = 0;
    bool failed = false;
    lp_context *ctx = NULL, *onehot = NULL;
    modes_point pts[MAX_LIST];
    if (env_load(&e, o, &err)) {
        rc = cli_fail("bench", &err);
        goto out;
    }
    if (e.n_adapters < 1) {
        fprintf(stderr, "loraplex bench: --adapter-modes needs --adapters A1,A2,...\n");
        rc = 2;
        goto out;
    }
    for (int i = 0; i < o->n_counts; i++) {
        if (o->counts[i] > e.n_adapters) {
            fprintf(stderr, "loraplex bench: --counts %d needs %d adapters, got %d\n",
                    o->counts[i], o->counts[i], e.n_adapters);
            rc = 2;
            goto out;
        }
        if (o->counts[i] > max_k) max_k = o->counts[i];
    }
    int n_mixed = e.n_adapters < MAX_MIXED ? e.n_adapters : MAX_MIXED;
    int max_rows = o->prompt > MAX_MIXED ? o->prompt : MAX_MIXED;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o->threads[0];
    cp.kv_f32 = o->kv_f32;
    cp.max_sequences = MAX_MIXED;
    cp.max_rows = max_rows;
    cp.max_logit_rows = MAX_MIXED;
    cp.max_seq_len = o->prompt + o->n_gen + 16;
    cp.n_ctx = MAX_MIXED * cp.max_seq_len;
    cp.max_adapters = max_k > n_mixed ? max_k : n_mixed;
    if (!(ctx = lp_context_create(e.model, &cp, &err))) {
        rc = cli_fail("context", &err);
        goto out;
    }
    cp.max_sequences = 1;
    cp.n_ctx = cp.max_seq_len;
    for (int a = 0, sum = 0; a < e.n_adapters; a++) /* room for all ranks stacked */
        if ((sum += e.adapters[a]->max_rank) > cp.max_adapter_rank) cp.max_adapter_rank = sum;
    if (!(onehot = lp_context_create(e.model, &cp, &err))) {
        rc = cli_fail("one-hot context", &err);
        goto out;
    }
    int base_slot[MAX_MIXED] = {0}, one_slot[MAX_MIXED], own_slot[MAX_MIXED];
    for (int i = 0; i < MAX_MIXED; i++) {
        one_slot[i] = 1;
        own_slot[i] = i + 1;
    }
    /* the bare base (after an untimed warm-up), and switching to another
     * merged model = loading one */
    failed = decode_speed(ctx, base_slot, 1, o->prompt, o->n_gen, 3, &err) < 0;
    tool_summary base = repeat_decode(ctx, base_slot, 1, o, &err, &failed);
    double load_ms[MAX_REPS];
    for (int r = 0; r < o->reps && !failed; r++) {
        double t0 = lp_now_seconds();
        const lp_model_params mp = {.huge_pages = o->huge_pages};
        lp_model *m = lp_model_load(o->model, &mp, &err);
        lp_context_params mcp = lp_context_default_params();
        mcp.n_threads = o->threads[0];
        mcp.kv_f32 = o->kv_f32;
        lp_context *c = m ? lp_context_create(m, &mcp, &err) : NULL;
        load_ms[r] = (lp_now_seconds() - t0) * 1e3;
        failed |= !c;
        lp_context_free(c);
        lp_model_free(m);
    }
    tool_summary switch_merged = tool_summarize(load_ms, o->reps);
    for (int i = 0; i < o->n_counts && !failed; i++) {
        int k = o->counts[i];
        modes_point *p = &pts[i];
        p->k = k;
        p->adapters_bytes = 0;
        for (int a = 0; a < k; a++) p->adapters_bytes += lp_adapter_bytes(e.adapters[a]);
        /* the frozen graph with all k adapters compiled in runs every one
         * of them on every row: one adapter of their stacked ranks costs that */
        lp_adapter *all = all_adapters(&e, k, &err);
        if (!all || lp_context_bind_adapter(onehot, 1, all, &err) ||
            bind_first(ctx, &e, k, cp.max_adapters, &err)) {
            lp_adapter_free(all);
            failed = true;
            break;
        }
        p->onehot_tok_s = repeat_decode(onehot, one_slot, 1, o, &err, &failed);
        lp_context_bind_adapter(onehot, 1, NULL, &err);
        lp_adapter_free(all);
        p->ours_tok_s = repeat_decode(ctx, one_slot, 1, o, &err, &failed);
    }
    /* mixed batches: n_mixed sequences with their own adapters, all one, none */
    tool_summary mixed[3] = {{0}};
    double switch_ns = 0;
    if (!failed && !bind_first(ctx, &e, n_mixed, cp.max_adapters, &err)) {
        mixed[0] = repeat_decode(ctx, own_slot, n_mixed, o, &err, &failed);
        mixed[1] = repeat_decode(ctx, one_slot, n_mixed, o, &err, &failed);
        mixed[2] = repeat_decode(ctx, base_slot, n_mixed, o, &err, &failed);
        switch_ns = bind_ns(ctx, &e, &err);
        failed |= switch_ns < 0;
    } else {
        failed = true;
    }
    if (failed) {
        rc = cli_fail("adapter modes", &err);
        goto out;
    }
    uint64_t model_bytes = file_bytes(o->model);
    lp_model_info info;
    lp_model_get_info(e.model, &info);
    if (!model_bytes) model_bytes = info.weight_bytes;
    uint64_t rss = peak_rss_bytes();
    if (o->json) {
        for (int i = 0; i < o->n_counts; i++) {
            const modes_point *p = &pts[i];
            printf("{\"k\":%d,\"model_bytes\":%llu,\"adapters_bytes\":%llu,"
                   "\"merged_bytes\":%llu,\"resident_bytes\":%llu",
                   p->k, (unsigned long long)model_bytes, (unsigned long long)p->adapters_bytes,
                   (unsigned long long)(model_bytes * (uint64_t)p->k),
                   (unsigned long long)(info.weight_bytes + p->adapters_bytes));
            print_summary_json("base_tok_s", base);
            print_summary_json("onehot_tok_s", p->onehot_tok_s);
            print_summary_json("ours_tok_s", p->ours_tok_s);
            print_summary_json("merged_switch_ms", switch_merged);
            printf(",\"ours_switch_ns\":%.4g,\"ours_overhead_pct\":%.4g,\"peak_rss_bytes\":%llu}\n",
                   switch_ns, 100 * (base.median / p->ours_tok_s.median - 1),
                   (unsigned long long)rss);
        }
        printf("{\"mixed_sequences\":%d", n_mixed);
        print_summary_json("own_adapters_tok_s", mixed[0]);
        print_summary_json("same_adapter_tok_s", mixed[1]);
        print_summary_json("base_tok_s", mixed[2]);
        printf("}\n");
    } else {
        printf("kernels: %s\n", o->kernels);
        printf("base %s: %.1f MiB, loaded in %.0f ms; adapters: %d, %.1f MiB each, loaded in "
               "%.1f ms (%.1f..%.1f)\n",
               o->model, model_bytes / 1048576.0, e.load_ms, e.n_adapters,
               lp_adapter_bytes(e.adapters[0]) / 1048576.0, e.adapter_load_ms.median,
               e.adapter_load_ms.min, e.adapter_load_ms.max);
        printf("decode of one sequence, %d prompt + %d tokens, %d runs: median (min..max); "
               "base %.2f tok/s (%.2f..%.2f)\n",
               o->prompt, o->n_gen, o->reps, base.median, base.min, base.max);
        printf("%-3s | %-10s | %-10s | %-20s | %-22s | %-22s | %s\n", "K", "merged MiB",
               "ours MiB", "merged switch ms", "one-hot tok/s", "ours tok/s", "ours vs base");
        for (int i = 0; i < o->n_counts; i++) {
            const modes_point *p = &pts[i];
            printf("%-3d | %10.1f | %10.1f | %6.1f (%5.1f..%5.1f) | %6.2f (%6.2f..%6.2f) | "
                   "%6.2f (%6.2f..%6.2f) | %+.1f %%\n",
                   p->k, p->k * (double)model_bytes / 1048576.0,
                   (info.weight_bytes + p->adapters_bytes) / 1048576.0, switch_merged.median,
                   switch_merged.min, switch_merged.max, p->onehot_tok_s.median,
                   p->onehot_tok_s.min, p->onehot_tok_s.max, p->ours_tok_s.median,
                   p->ours_tok_s.min, p->ours_tok_s.max,
                   100 * (p->ours_tok_s.median / base.median - 1));
        }
        printf("switch: merged = load another model (%.1f ms); one-hot and ours = change a row's "
               "slot (free); rebinding a slot: %.1f ns\n",
               switch_merged.median, switch_ns);
        printf("mixed batch, %d sequences, tok/s over all: own adapters %.2f (%.2f..%.2f), "
               "one adapter %.2f (%.2f..%.2f), base %.2f (%.2f..%.2f)\n",
               n_mixed, mixed[0].median, mixed[0].min, mixed[0].max, mixed[1].median,
               mixed[1].min, mixed[1].max, mixed[2].median, mixed[2].min, mixed[2].max);
        printf("peak RSS %.1f MiB\n", rss / 1048576.0);
    }
    if (o->svg && modes_svg(o, pts, o->n_counts, model_bytes / 1048576.0, base.median, mixed,
                            &err)) {
        rc = cli_fail("svg", &err);
        goto out;
    }
    rc = 0;
out:
    lp_context_free(onehot);
    lp_context_free(ctx);
    env_free(&e);
    return rc;
}

/* ---- mode 4: what each adapter adds to a decode step ------------------------------------ */

/* One-row decode steps over a committed prompt, base only and each adapter
 * (one per slot) taking turns step by step, the order rotated every round:
 * the cost of a branch that is a few percent of a step stays visible on a
 * machine whose speed drifts by more than that between separate runs. */
static int bench_adapter_cost(const bench_options *o) {
    lp_error err = {0};
    bench_env e;
    memset(&e, 0, sizeof e);
    int rc = 1, rounds = o->n_gen * o->reps;
    lp_context *ctx = NULL;
    int32_t *prompt = malloc((size_t)o->prompt * sizeof *prompt);
    lp_row *rows = malloc((size_t)o->prompt * sizeof *rows);
    double *ms = NULL;
    if (env_load(&e, o, &err)) {
        rc = cli_fail("bench", &err);
        goto out;
    }
    int nc = e.n_adapters + 1;
    if (!prompt || !rows || !(ms = malloc((size_t)nc * (size_t)rounds * sizeof *ms))) {
        fprintf(stderr, "loraplex bench: out of memory\n");
        goto out;
    }
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = o->threads[0];
    cp.kv_f32 = o->kv_f32;
    cp.max_sequences = 1;
    cp.max_rows = o->prompt;
    cp.max_logit_rows = 1;
    cp.n_ctx = cp.max_seq_len = o->prompt + 16;
    cp.max_adapters = e.n_adapters;
    if (!(ctx = lp_context_create(e.model, &cp, &err)) || bind_first(ctx, &e, e.n_adapters, e.n_adapters, &err)) {
        rc = cli_fail("context", &err);
        goto out;
    }
    random_tokens(e.model, 7, prompt, o->prompt);
    for (int i = 0; i < o->prompt; i++)
        rows[i] = (lp_row){.token = prompt[i], .pos = i, .parent = -1, .commit = true, .logits = i == o->prompt - 1};
    if (lp_forward(ctx, rows, o->prompt, &err)) {
        rc = cli_fail("prefill", &err);
        goto out;
    }
    for (int r = -1; r < rounds; r++) /* round -1 warms every path up */
        for (int k = 0; k < nc; k++) {
            int c = (k + (r < 0 ? 0 : r)) % nc;
            lp_row row = {.token = prompt[(r + 1 + c) % o->prompt], .pos = o->prompt, .adapter = c, .parent = -1,
                          .logits = true};
            double t0 = lp_now_seconds();
            if (lp_forward(ctx, &row, 1, &err)) {
                rc = cli_fail("decode", &err);
                goto out;
            }
            if (r >= 0) ms[(size_t)c * (size_t)rounds + (size_t)r] = (lp_now_seconds() - t0) * 1e3;
        }
    if (!o->json)
        printf("kernels: %s\n%d threads, %d-token prompt, %d one-row steps each, taking turns: median (q1..q3)\n"
               "%-40s | step ms                  | added ms\n",
               o->kernels, o->threads[0], o->prompt, rounds, "adapter");
    double base = 0;
    for (int c = 0; c < nc; c++) {
        double *v = ms + (size_t)c * (size_t)rounds;
        qsort(v, (size_t)rounds, sizeof *v, tool_cmp_double);
        double med = tool_quantile_sorted(v, rounds, 0.5), q1 = tool_quantile_sorted(v, rounds, 0.25),
               q3 = tool_quantile_sorted(v, rounds, 0.75);
        if (c == 0) base = med;
        const char *name = c ? e.adapter_paths[c - 1] : "(base only)";
        if (o->json)
            printf("{\"mode\":\"adapter_cost\",\"adapter\":\"%s\",\"threads\":%d,\"step_ms\":%.4f,"
                   "\"q1_ms\":%.4f,\"q3_ms\":%.4f,\"added_ms\":%.4f}\n",
                   c ? name : "", o->threads[0], med, q1, q3, med - base);
        else
            printf("%-40.40s | %7.3f (%7.3f..%7.3f) | %+.3f\n", name, med, q1, q3, med - base);
    }
    rc = 0;
out:
    lp_context_free(ctx);
    env_free(&e);
    free(ms);
    free(rows);
    free(prompt);
    return rc;
}

/* ---- the command --------------------------------------------------------------------------- */

static void bench_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex bench -m MODEL [options]\n"
            "  -m, --model PATH        the model (the base with --adapter-modes)\n"
            "  -p, --prompt-tokens N   prompt length (default 128)\n"
            "  -n, --gen-tokens N      tokens decoded (per stream) (default 64)\n"
            "  -t, --threads LIST      thread counts, e.g. 1,2 (default: all cores; the\n"
            "                          streams and adapter modes use the first)\n"
            "  -r, --reps N            repetitions; tables show median (min..max) (default 3)\n"
            "      --bw-mib N          buffer of the read-bandwidth test (default 2048, 0 = skip)\n"
            "      --streams LIST      N concurrent streams vs N sequential runs, e.g. 1,2,4,8\n"
            "      --adapters A,B,...  adapter files: with --streams, N streams each with its\n"
            "                          own adapter vs all with the first\n"
            "      --adapter-modes     K merged models vs one-hot vs runtime adapters\n"
            "      --counts LIST       K values for --adapter-modes (default 1,4,10,32, capped\n"
            "                          at the number of adapters)\n"
            "      --adapter-cost      what each of --adapters adds to a one-row decode step:\n"
            "                          steps with the base alone and with each adapter take\n"
            "                          turns (n x reps each), so the machine's drift cancels\n"
            "      --profile P         a QUAD shared profile (.lpq) for adapters fitted to it\n"
            "      --kv-f32            KV cache in f32 (default f16)\n"
            "      --huge-pages        read a .lpx model into 2 MiB pages (a copy) instead of\n"
            "                          using it in place from its memory map\n"
            "      --json              JSON lines instead of tables\n"
            "      --svg FILE          write a chart (streams and adapter modes)\n"
            "      --speculate ...     speculative decoding per task (bench --speculate --help)\n");
}

static int parse_bench(int argc, char **argv, bench_options *o) {
    memset(o, 0, sizeof *o);
    o->prompt = 128;
    o->n_gen = 64;
    o->reps = 3;
    o->n_threads = 1;
    o->bw_mib = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long k;
#define VALUE() do { if (!(v = cli_value(argc, argv, &i))) return -1; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VALUE(); o->model = v; }
        else if (!strcmp(a, "--adapters")) { VALUE(); o->adapters = v; }
        else if (!strcmp(a, "--profile")) { VALUE(); o->profile = v; }
        else if (!strcmp(a, "--svg")) { VALUE(); o->svg = v; }
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--adapter-modes")) o->adapter_modes = true;
        else if (!strcmp(a, "--adapter-cost")) o->adapter_cost = true;
        else if (!strcmp(a, "--kv-f32")) o->kv_f32 = true;
        else if (!strcmp(a, "--huge-pages")) o->huge_pages = true;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt-tokens")) {
            VALUE(); if (!cli_int(a, v, 1, 1 << 16, &k)) return -1;
            o->prompt = (int)k;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--gen-tokens")) {
            VALUE(); if (!cli_int(a, v, 1, 1 << 16, &k)) return -1;
            o->n_gen = (int)k;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            VALUE(); if (!cli_int(a, v, 1, MAX_REPS, &k)) return -1;
            o->reps = (int)k;
        } else if (!strcmp(a, "--bw-mib")) {
            VALUE(); if (!cli_int(a, v, 0, 1 << 20, &o->bw_mib)) return -1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VALUE();
            if ((o->n_threads = tool_parse_int_list(a, v, 1, 256, o->threads, MAX_LIST)) < 0)
                return -1;
        } else if (!strcmp(a, "--streams")) {
            VALUE();
            if ((o->n_streams = tool_parse_int_list(a, v, 1, 64, o->streams, MAX_LIST)) < 0)
                return -1;
        } else if (!strcmp(a, "--counts")) {
            VALUE();
            if ((o->n_counts = tool_parse_int_list(a, v, 1, MAX_BENCH_ADAPTERS, o->counts,
                                                   MAX_LIST)) < 0)
                return -1;
        } else {
            fprintf(stderr, "loraplex bench: unknown option '%s' (see --help)\n", a);
            return -1;
        }
#undef VALUE
    }
    if (!o->model) {
        fprintf(stderr, "loraplex bench: -m MODEL is required (see --help)\n");
        return -1;
    }
    if ((o->adapter_modes + o->adapter_cost + (o->n_streams > 0)) > 1) {
        fprintf(stderr, "loraplex bench: --streams, --adapter-modes and --adapter-cost are separate runs\n");
        return -1;
    }
    if (o->adapter_cost && !o->adapters) {
        fprintf(stderr, "loraplex bench: --adapter-cost needs --adapters A1,A2,...\n");
        return -1;
    }
    if (o->adapter_modes && !o->adapters) {
        fprintf(stderr, "loraplex bench: --adapter-modes needs --adapters A1,A2,...\n");
        return -1;
    }
    return 0;
}

/* Default K values: 1,4,10,32 capped at the number of adapters given. */
static void default_counts(bench_options *o) {
    static const int ks[] = {1, 4, 10, 32};
    int n_adapters = 1;
    for (const char *p = o->adapters; p && *p; p++) n_adapters += *p == ',';
    o->n_counts = 0;
    for (int i = 0; i < 4; i++)
        if (ks[i] <= n_adapters) o->counts[o->n_counts++] = ks[i];
    if (o->n_counts == 0 || o->counts[o->n_counts - 1] != n_adapters)
        if (n_adapters < 32) o->counts[o->n_counts++] = n_adapters;
}

int cli_bench_speculate(int argc, char **argv); /* cli_bench_spec.c */

int cli_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--speculate")) return cli_bench_speculate(argc, argv);
    bench_options o;
    int rc = parse_bench(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    lp_error err = {0};
    if (cli_kernels_line(o.kernels, sizeof o.kernels, &err)) return cli_fail("bench", &err) + 1;
    /* JSON lines stay JSON: the levels go to stderr there (tables: above them) */
    if (o.json) fprintf(stderr, "kernels: %s\n", o.kernels);
    if (o.adapter_modes) {
        if (!o.n_counts) default_counts(&o);
        return bench_adapter_modes(&o);
    }
    if (o.n_streams) return bench_streams(&o);
    if (o.adapter_cost) return bench_adapter_cost(&o);
    return bench_speed(&o);
}
