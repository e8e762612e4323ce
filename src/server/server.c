/* `loraplex serve` (server.h): HTTP routes on libmicrohttpd, jobs, and the
 * scheduler thread that steps the engine.
 *
 * A job is one HTTP request: its prompt tokens, settings and n choices (one
 * engine request each). Connection threads create jobs and wait on them;
 * the scheduler submits them, steps, and fills their text; everything a job
 * shares between the two sides is guarded by the server's one mutex. A job
 * is freed when both sides let go of it (refs). */
#define _GNU_SOURCE
#include "server.h"

#include <arpa/inet.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "../base/base.h"
#include "page.h"

#define LP_BATCH_BUCKETS 10 /* batch rows histogram: le 1, 2, 4, ..., 256, +Inf */

/* ---- jobs ------------------------------------------------------------------------------ */

typedef struct job job;

typedef struct choice {
    job *job;
    int request;               /* engine request id (-1: not submitted) */
    const lp_adapter *adapter;
    struct srv_adapter *sa;    /* its adapter, a reference held (NULL: the base) */
    lp_sbuf text;              /* all text so far */
    size_t sent;               /* bytes of text streamed */
    bool done, role_sent, end_sent;
    const char *finish;        /* OpenAI finish_reason once done */
    int n_generated;
    lp_token_logprobs *lps;    /* [n_lps] generated tokens' log-probabilities (logprobs) */
    int n_lps, cap_lps;
    int lps_sent;              /* of them streamed ... */
    size_t lps_offset;         /* ... and their text's length */
    const lp_forecast *forecast; /* its adapter's forecast set (NULL: none) */
} choice;

struct job {
    struct server *srv;
    lp_api_kind kind;
    int32_t *prompt;
    int n_prompt;
    int max_tokens;
    lp_sampler_params sampling;
    char *stop[LP_API_MAX_STOP];
    int n_stop;
    int n;
    choice ch[LP_API_MAX_N];
    bool stream, include_usage, seed_set;
    bool logprobs;
    int top_logprobs;
    bool speculate;            /* decode speculatively (never with logprobs) */
    lp_logit_bias *logit_bias; /* [sampling.n_logit_bias], sampling.logit_bias points here */
    char id[32], model[128];
    lp_api_meta meta;
    double t_start;
    /* under srv->mu */
    bool cancel;               /* the client left, or the server stops */
    int refs;
    int n_done;
    lp_sbuf out;               /* stream bytes not yet handed to the connection */
    size_t out_at;
    bool stream_ended;         /* [DONE] is in out */
    pthread_cond_t cond;       /* text arrived or a choice ended */
    job *next;                 /* queue link */
    job *next_active;          /* scheduler's list (scheduler thread only) */
};

/* An adapter the server serves. References: the table's while it is listed
 * (until /v1/unload_lora_adapter) and one per choice that uses it, so an
 * unloaded adapter lives until its last request ends; then it goes to the
 * retired list and the scheduler thread unbinds it from the context and
 * frees it (the context's slots are the scheduler's). */
typedef struct srv_adapter {
    char name[128];
    lp_adapter *adapter;
    /* under mu */
    int refs;
    uint64_t requests, tokens;
    uint64_t spec_requests, spec_passes, spec_drafted, spec_accepted;
    lp_forecast *forecast;     /* --forecast NAME=PATH (NULL: none; set at startup) */
    struct srv_adapter *next_retired;
} srv_adapter;

typedef struct server {
    lp_server_params p;
    lp_model *model;
    lp_context *ctx;
    lp_engine *engine;
    char base_name[128];
    srv_adapter *adapters[LP_SERVER_MAX_ADAPTERS]; /* under mu; NULL: a free entry
                                  (an entry's index is llama.cpp's lora id) */
    int n_adapters;            /* listed, under mu */
    srv_adapter *retired;      /* under mu: unreferenced, for the scheduler to free */
    char adapter_dir[PATH_MAX]; /* --adapter-dir resolved ("": hot loading off) */
    int max_rank;              /* the context's max_adapter_rank */
    uint64_t loads, unloads;   /* under mu */
    int n_ctx, n_vocab;
    bool has_template;         /* the model has a chat template */

    pthread_mutex_t mu;
    pthread_cond_t work;       /* a job was queued or cancelled, or stop */
    job *queue_head, *queue_tail;
    int queued;                /* accepted, not yet handed to the engine */
    int in_flight;             /* accepted and not finished (queued included) */
    bool stopping;
    int64_t next_id;
    /* metrics, under mu */
    uint64_t requests_total, responses_4xx, responses_5xx, tokens_prompt, tokens_generated;
    int64_t steps, rows;
    int kv_used, kv_total, kv_block_tokens;
    int last_batch_rows;
    uint64_t batch_hist[LP_BATCH_BUCKETS]; /* steps with at most 2^i rows (the last: any) */
    uint64_t base_spec_requests, base_spec_passes, base_spec_drafted, base_spec_accepted;
    /* speculation, fixed after startup */
    lp_forecast *base_forecast; /* --forecast BASE=PATH */
    bool costed;
    float pass_cost[LP_SPEC_COST_ROWS];

    pthread_t scheduler;
    struct MHD_Daemon *daemon;
} server;

static void adapter_unref_locked(server *s, srv_adapter *a) {
    if (--a->refs > 0) return;
    a->next_retired = s->retired;
    s->retired = a;
    pthread_cond_signal(&s->work);
}

/* Frees retired adapters (scheduler thread, or after it stopped): no engine
 * request uses them any more; slots still bound to one are unbound. */
static void free_retired(server *s, srv_adapter *list) {
    for (srv_adapter *a = list, *next; a; a = next) {
        next = a->next_retired;
        for (int slot = 1; s->ctx && slot <= lp_context_n_slots(s->ctx); slot++)
            if (lp_context_slot_adapter(s->ctx, slot) == a->adapter) lp_context_bind_adapter(s->ctx, slot, NULL, NULL);
        lp_adapter_free(a->adapter);
        lp_forecast_free(a->forecast);
        free(a);
    }
}

static void job_unref_locked(job *j) {
    if (--j->refs > 0) return;
    for (int i = 0; i < j->n; i++) {
        lp_sbuf_free(&j->ch[i].text);
        free(j->ch[i].lps);
        if (j->ch[i].sa) adapter_unref_locked(j->srv, j->ch[i].sa);
    }
    free(j->logit_bias);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    lp_sbuf_free(&j->out);
    pthread_cond_destroy(&j->cond);
    free(j->prompt);
    free(j);
}

static void job_unref(job *j) {
    server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the scheduler thread ------------------------------------------------------------------ */

/* Engine callback: text of one choice (scheduler thread, inside a step). */
static bool on_text(void *user, int request, const char *text, size_t len) {
    (void)request;
    choice *c = user;
    server *s = c->job->srv;
    pthread_mutex_lock(&s->mu);
    lp_sbuf_add(&c->text, text, len);
    bool keep = !c->job->cancel;
    pthread_cond_broadcast(&c->job->cond);
    pthread_mutex_unlock(&s->mu);
    return keep;
}

/* Engine callback: a generated token's log-probabilities (scheduler thread). */
static void on_token(void *user, int request, const lp_token_logprobs *lp) {
    (void)request;
    choice *c = user;
    server *s = c->job->srv;
    pthread_mutex_lock(&s->mu);
    if (c->n_lps == c->cap_lps) {
        int cap = c->cap_lps ? 2 * c->cap_lps : 32;
        lp_token_logprobs *grown = realloc(c->lps, (size_t)cap * sizeof *grown);
        if (grown) {
            c->lps = grown;
            c->cap_lps = cap;
        }
    }
    if (c->n_lps < c->cap_lps) c->lps[c->n_lps++] = *lp; /* out of memory: the list ends short */
    pthread_mutex_unlock(&s->mu);
}

static void choice_end_locked(choice *c, const char *finish, int n_generated) {
    c->done = true;
    c->finish = finish;
    c->n_generated = n_generated;
    c->job->n_done++;
    c->job->srv->tokens_generated += (uint64_t)n_generated;
    if (c->sa) c->sa->tokens += (uint64_t)n_generated;
    pthread_cond_broadcast(&c->job->cond);
}

static lp_speculate speculation(const server *s, const lp_forecast *f);

static void submit_job(server *s, job *j) {
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        lp_request rq = lp_request_default();
        rq.prompt = j->prompt;
        rq.n_prompt = j->n_prompt;
        rq.adapter = c->adapter;
        rq.sampling = j->sampling;
        rq.sampling.seed = j->sampling.seed + (uint64_t)i;
        rq.max_tokens = j->max_tokens;
        rq.stop = (const char *const *)j->stop;
        rq.n_stop = j->n_stop;
        rq.fn = on_text;
        rq.user = c;
        if (j->logprobs) {
            rq.token_fn = on_token;
            rq.top_logprobs = j->top_logprobs;
        }
        lp_speculate sp = speculation(s, c->forecast);
        if (j->speculate) rq.speculate = &sp; /* copied by submit */
        lp_error err = {0};
        c->request = lp_engine_submit(s->engine, &rq, &err);
        if (c->request < 0) {
            fprintf(stderr, "loraplex serve: %s: %s\n", j->id, err.message);
            pthread_mutex_lock(&s->mu);
            choice_end_locked(c, "stop", 0);
            pthread_mutex_unlock(&s->mu);
        }
    }
}

/* How a speculating request with this forecast set (NULL: none) decodes. */
static lp_speculate speculation(const server *s, const lp_forecast *f) {
    lp_speculate sp = lp_speculate_default();
    if (f && s->p.speculate != LP_SERVER_SPEC_LOOKUP) {
        sp.forecast = f;
        int k = lp_forecast_k(f);
        sp.depth = s->p.tree_depth < k ? s->p.tree_depth : k;
        for (int d = 0; d < sp.depth; d++) sp.branches[d] = s->p.tree[d];
    }
    sp.lookup_ngram = s->p.lookup_ngram;
    sp.lookup_len = s->p.lookup_len;
    if (s->costed) memcpy(sp.pass_cost, s->pass_cost, sizeof sp.pass_cost);
    return sp;
}

/* A finished speculating choice's counters, into its adapter's (mu held). */
static void count_spec_locked(server *s, const choice *c, const lp_spec_stats *ss) {
    uint64_t *req = c->sa ? &c->sa->spec_requests : &s->base_spec_requests;
    uint64_t *passes = c->sa ? &c->sa->spec_passes : &s->base_spec_passes;
    uint64_t *drafted = c->sa ? &c->sa->spec_drafted : &s->base_spec_drafted;
    uint64_t *accepted = c->sa ? &c->sa->spec_accepted : &s->base_spec_accepted;
    (*req)++;
    *passes += (uint64_t)ss->n_passes;
    *drafted += (uint64_t)ss->n_drafted;
    *accepted += (uint64_t)ss->n_accepted;
}

/* Choices whose engine request finished: their reason, then released. */
static void harvest(server *s, job *j) {
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        lp_request_stats st;
        if (c->done || c->request < 0 || lp_engine_request_stats(s->engine, c->request, &st) || !st.done) continue;
        lp_spec_stats ss = {0};
        if (j->speculate) lp_engine_request_spec_stats(s->engine, c->request, &ss);
        pthread_mutex_lock(&s->mu);
        if (j->speculate) count_spec_locked(s, c, &ss);
        choice_end_locked(c, lp_api_finish_reason(st.stop_reason), st.n_generated);
        pthread_mutex_unlock(&s->mu);
        lp_engine_release(s->engine, c->request);
        c->request = -1;
    }
}

static void *scheduler_main(void *arg) {
    server *s = arg;
    job *active = NULL;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && !s->queue_head && !active && !s->retired) pthread_cond_wait(&s->work, &s->mu);
        srv_adapter *retired = s->retired;
        s->retired = NULL;
        job *pending = s->queue_head;
        s->queue_head = s->queue_tail = NULL;
        s->queued = 0;
        if (s->stopping) {
            for (job *j = pending; j; j = j->next) j->cancel = true;
            for (job *j = active; j; j = j->next_active) j->cancel = true;
        }
        bool stop_now = s->stopping && !pending && !active;
        pthread_mutex_unlock(&s->mu);
        free_retired(s, retired);
        if (stop_now) break;
        if (!pending && !active) continue;

        for (job *j = pending, *next; j; j = next) {
            next = j->next;
            submit_job(s, j);
            j->next_active = active;
            active = j;
        }
        /* cancelled jobs (client gone, shutdown): their requests end now */
        for (job *j = active; j; j = j->next_active) {
            pthread_mutex_lock(&s->mu);
            bool cancel = j->cancel;
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; cancel && i < j->n; i++)
                if (j->ch[i].request >= 0 && !j->ch[i].done) lp_engine_cancel(s->engine, j->ch[i].request, NULL);
        }
        lp_error err = {0};
        int64_t rows_before = 0, steps_before = 0, steps, rows;
        lp_engine_counts(s->engine, &steps_before, &rows_before);
        if (lp_engine_step(s->engine, &err) < 0) fprintf(stderr, "loraplex serve: step: %s\n", err.message);
        lp_engine_counts(s->engine, &steps, &rows);
        int kv_used, kv_total, bt;
        lp_kv_usage(s->ctx, &kv_used, &kv_total, &bt);
        pthread_mutex_lock(&s->mu);
        s->steps = steps;
        s->rows = rows;
        if (steps > steps_before) {
            s->last_batch_rows = (int)(rows - rows_before);
            int k = 0;
            while (k < LP_BATCH_BUCKETS - 1 && s->last_batch_rows > 1 << k) k++;
            s->batch_hist[k]++;
        }
        s->kv_used = kv_used;
        s->kv_total = kv_total;
        s->kv_block_tokens = bt;
        pthread_mutex_unlock(&s->mu);

        job **link = &active;
        while (*link) {
            job *j = *link;
            harvest(s, j);
            pthread_mutex_lock(&s->mu);
            bool finished = j->n_done == j->n;
            if (finished) {
                s->in_flight--;
                *link = j->next_active;
                job_unref_locked(j);
            }
            pthread_mutex_unlock(&s->mu);
            if (!finished) link = &j->next_active;
        }
    }
    return NULL;
}

/* ---- HTTP: connections, responses ---------------------------------------------------------- */

typedef struct conn {
    lp_sbuf body;
    bool too_big;
    double t0;
    char what[160];            /* "POST /v1/completions", for the log line */
    unsigned status;
} conn;

static enum MHD_Result send_body(conn *cn, struct MHD_Connection *c, unsigned status, const char *type, const char *data,
                                 size_t len) {
    cn->status = status;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(server *s, conn *cn, struct MHD_Connection *c, unsigned status, const char *type,
                                  const char *message) {
    lp_sbuf b = {0};
    lp_api_error_body(&b, message, type);
    pthread_mutex_lock(&s->mu);
    if (status >= 500) s->responses_5xx++;
    else s->responses_4xx++;
    pthread_mutex_unlock(&s->mu);
    enum MHD_Result rc = send_body(cn, c, status, "application/json", b.failed ? "{}" : b.data, b.failed ? 2 : b.len);
    lp_sbuf_free(&b);
    return rc;
}

static enum MHD_Result send_json(conn *cn, struct MHD_Connection *c, lp_sbuf *b) {
    if (b->failed) return MHD_NO;
    return send_body(cn, c, 200, "application/json", b->data, b->len);
}

/* Constant-time comparison of the bearer token. */
static bool authorized(const server *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    const char *got = h + 7, *want = s->p.api_key;
    size_t ng = strlen(got), nw = strlen(want);
    unsigned char diff = (unsigned char)(ng != nw);
    for (size_t i = 0; i < nw; i++) diff |= (unsigned char)(want[i] ^ (i < ng ? got[i] : 0));
    return diff == 0;
}

static enum MHD_Result route_models(server *s, conn *cn, struct MHD_Connection *c) {
    lp_sbuf b = {0};
    lp_sbuf_lit(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    lp_sbuf_json_string(&b, s->base_name, strlen(s->base_name));
    lp_sbuf_lit(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"loraplex\"}");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++) {
        if (!s->adapters[i]) continue;
        lp_sbuf_lit(&b, ",{\"id\":");
        lp_sbuf_json_string(&b, s->adapters[i]->name, strlen(s->adapters[i]->name));
        lp_sbuf_lit(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"loraplex\",\"parent\":");
        lp_sbuf_json_string(&b, s->base_name, strlen(s->base_name));
        lp_sbuf_lit(&b, "}");
    }
    pthread_mutex_unlock(&s->mu);
    lp_sbuf_lit(&b, "]}");
    enum MHD_Result rc = send_json(cn, c, &b);
    lp_sbuf_free(&b);
    return rc;
}

/* Speculation counters per adapter, the base as adapter="" (mu held). */
static void spec_metrics_locked(const server *s, lp_sbuf *b) {
    static const struct {
        const char *name;
        size_t offset_sa;
    } rows[] = {
        {"loraplex_spec_requests_total", offsetof(srv_adapter, spec_requests)},
        {"loraplex_spec_passes_total", offsetof(srv_adapter, spec_passes)},
        {"loraplex_spec_drafted_tokens_total", offsetof(srv_adapter, spec_drafted)},
        {"loraplex_spec_accepted_tokens_total", offsetof(srv_adapter, spec_accepted)},
    };
    const uint64_t base[] = {s->base_spec_requests, s->base_spec_passes, s->base_spec_drafted, s->base_spec_accepted};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        lp_sbuf_printf(b, "# TYPE %s counter\n%s{adapter=\"\"} %llu\n", rows[r].name, rows[r].name,
                       (unsigned long long)base[r]);
        for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++) {
            const srv_adapter *a = s->adapters[i];
            if (!a) continue;
            uint64_t v;
            memcpy(&v, (const char *)a + rows[r].offset_sa, sizeof v);
            lp_sbuf_printf(b, "%s{adapter=\"%s\"} %llu\n", rows[r].name, a->name, (unsigned long long)v);
        }
    }
}

static enum MHD_Result route_metrics(server *s, conn *cn, struct MHD_Connection *c) {
    lp_sbuf b = {0};
    pthread_mutex_lock(&s->mu);
    lp_sbuf_printf(&b,
                   "# TYPE loraplex_requests_total counter\nloraplex_requests_total %llu\n"
                   "# TYPE loraplex_responses_4xx_total counter\nloraplex_responses_4xx_total %llu\n"
                   "# TYPE loraplex_responses_5xx_total counter\nloraplex_responses_5xx_total %llu\n"
                   "# TYPE loraplex_prompt_tokens_total counter\nloraplex_prompt_tokens_total %llu\n"
                   "# TYPE loraplex_generated_tokens_total counter\nloraplex_generated_tokens_total %llu\n"
                   "# TYPE loraplex_queue_depth gauge\nloraplex_queue_depth %d\n"
                   "# TYPE loraplex_active_requests gauge\nloraplex_active_requests %d\n"
                   "# TYPE loraplex_engine_steps_total counter\nloraplex_engine_steps_total %lld\n"
                   "# TYPE loraplex_engine_rows_total counter\nloraplex_engine_rows_total %lld\n"
                   "# TYPE loraplex_batch_rows gauge\nloraplex_batch_rows %d\n"
                   "# TYPE loraplex_kv_blocks_used gauge\nloraplex_kv_blocks_used %d\n"
                   "# TYPE loraplex_kv_blocks_total gauge\nloraplex_kv_blocks_total %d\n"
                   "# TYPE loraplex_kv_block_tokens gauge\nloraplex_kv_block_tokens %d\n"
                   "# TYPE loraplex_adapter_requests_total counter\n",
                   (unsigned long long)s->requests_total, (unsigned long long)s->responses_4xx,
                   (unsigned long long)s->responses_5xx, (unsigned long long)s->tokens_prompt,
                   (unsigned long long)s->tokens_generated, s->queued, s->in_flight - s->queued, (long long)s->steps,
                   (long long)s->rows, s->last_batch_rows, s->kv_used, s->kv_total, s->kv_block_tokens);
    /* names are [A-Za-z0-9._-] (checked at load): no label escaping needed */
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++)
        if (s->adapters[i])
            lp_sbuf_printf(&b, "loraplex_adapter_requests_total{adapter=\"%s\"} %llu\n", s->adapters[i]->name,
                           (unsigned long long)s->adapters[i]->requests);
    lp_sbuf_lit(&b, "# TYPE loraplex_adapter_generated_tokens_total counter\n");
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++)
        if (s->adapters[i])
            lp_sbuf_printf(&b, "loraplex_adapter_generated_tokens_total{adapter=\"%s\"} %llu\n", s->adapters[i]->name,
                           (unsigned long long)s->adapters[i]->tokens);
    /* choices running or queued with it: its references besides the table's */
    lp_sbuf_lit(&b, "# TYPE loraplex_adapter_active_requests gauge\n");
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++)
        if (s->adapters[i])
            lp_sbuf_printf(&b, "loraplex_adapter_active_requests{adapter=\"%s\"} %d\n", s->adapters[i]->name,
                           s->adapters[i]->refs - 1);
    /* rows per engine step: the batch size */
    lp_sbuf_lit(&b, "# TYPE loraplex_batch_rows_per_step histogram\n");
    uint64_t cumulative = 0;
    for (int k = 0; k < LP_BATCH_BUCKETS; k++) {
        cumulative += s->batch_hist[k];
        if (k < LP_BATCH_BUCKETS - 1)
            lp_sbuf_printf(&b, "loraplex_batch_rows_per_step_bucket{le=\"%d\"} %llu\n", 1 << k,
                           (unsigned long long)cumulative);
        else lp_sbuf_printf(&b, "loraplex_batch_rows_per_step_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cumulative);
    }
    lp_sbuf_printf(&b, "loraplex_batch_rows_per_step_sum %llu\nloraplex_batch_rows_per_step_count %llu\n",
                   (unsigned long long)s->rows, (unsigned long long)cumulative);
    spec_metrics_locked(s, &b);
    lp_sbuf_printf(&b,
                   "# TYPE loraplex_adapters_loaded gauge\nloraplex_adapters_loaded %d\n"
                   "# TYPE loraplex_adapter_loads_total counter\nloraplex_adapter_loads_total %llu\n"
                   "# TYPE loraplex_adapter_unloads_total counter\nloraplex_adapter_unloads_total %llu\n",
                   s->n_adapters, (unsigned long long)s->loads, (unsigned long long)s->unloads);
    pthread_mutex_unlock(&s->mu);
    enum MHD_Result rc = b.failed ? MHD_NO : send_body(cn, c, 200, "text/plain; version=0.0.4", b.data, b.len);
    lp_sbuf_free(&b);
    return rc;
}

/* The adapter a model name selects (mu held): -1 the base, -2 unknown. */
static int adapter_by_name(const server *s, const char *name) {
    if (!name || !name[0] || !strcmp(name, s->base_name)) return -1;
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++)
        if (s->adapters[i] && !strcmp(s->adapters[i]->name, name)) return i;
    return -2;
}

/* The request's prompt as tokens: the chat template for chat, the text or
 * the given ids for completions; BOS as `loraplex run` adds it. */
static int prompt_tokens(server *s, const lp_api_request *r, job *j, char *msg, size_t cap) {
    lp_error err = {0};
    char *text = NULL;
    const char *src = r->prompt;
    bool special = false;
    if (r->kind == LP_API_CHAT && !s->has_template) {
        /* a base without a chat template (the demo world's): the messages'
         * texts in order are the prompt, so a one-message chat is the same
         * request as a completion of that text */
        size_t total = 1;
        for (int i = 0; i < r->n_messages; i++) total += strlen(r->messages[i].content);
        text = lp_alloc(total);
        if (!text) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        size_t at = 0;
        for (int i = 0; i < r->n_messages; i++) {
            size_t n = strlen(r->messages[i].content);
            memcpy(text + at, r->messages[i].content, n);
            at += n;
        }
        text[at] = 0;
        src = text;
    } else if (r->kind == LP_API_CHAT) {
        text = lp_chat_apply(s->model, r->messages, r->n_messages, true, &err);
        if (!text) {
            snprintf(msg, cap, "cannot render the chat: %.300s", err.message);
            return -1;
        }
        src = text;
        special = true;
    }
    if (src) {
        size_t len = strlen(src);
        int n_cap = (int)(len + 8 < (size_t)s->n_ctx + 8 ? len + 8 : (size_t)s->n_ctx + 8);
        j->prompt = malloc((size_t)n_cap * sizeof(int32_t));
        int n = j->prompt ? lp_tokenize(s->model, src, len, lp_model_add_bos(s->model), special, j->prompt, n_cap, &err)
                          : -1;
        lp_free(text);
        if (n < 0) {
            snprintf(msg, cap, "the prompt does not fit the context of %d tokens (or cannot be tokenized: %.300s)",
                     s->n_ctx, err.message);
            return -1;
        }
        j->n_prompt = n;
    } else {
        int V = s->n_vocab;
        for (int i = 0; i < r->n_prompt_tokens; i++)
            if (r->prompt_tokens[i] >= V) {
                snprintf(msg, cap, "prompt[%d] = %d is outside the vocabulary (%d tokens)", i, r->prompt_tokens[i], V);
                return -1;
            }
        j->prompt = malloc((size_t)r->n_prompt_tokens * sizeof(int32_t));
        if (!j->prompt) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        memcpy(j->prompt, r->prompt_tokens, (size_t)r->n_prompt_tokens * sizeof(int32_t));
        j->n_prompt = r->n_prompt_tokens;
    }
    if (j->n_prompt == 0) {
        snprintf(msg, cap, "the prompt is empty");
        return -1;
    }
    if (j->n_prompt >= s->n_ctx) {
        snprintf(msg, cap, "this model's context is %d tokens; the prompt has %d", s->n_ctx, j->n_prompt);
        return -1;
    }
    return 0;
}

/* A job from a parsed request (adapters resolved, prompt tokenized). On
 * failure returns NULL with an HTTP status and message. */
static job *make_job(server *s, const lp_api_request *r, unsigned *status, char *msg, size_t cap) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        *status = 500;
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    j->srv = s;
    j->kind = r->kind;
    j->n = r->n;
    j->stream = r->stream;
    j->include_usage = r->include_usage;
    j->sampling = r->sampling;
    j->logprobs = r->logprobs;
    j->top_logprobs = r->top_logprobs;
    /* the engine reports log-probabilities only without speculation: such
     * requests decode plainly */
    j->speculate = (r->speculate >= 0 ? r->speculate == 1 : s->p.speculate != LP_SERVER_SPEC_OFF) && !r->logprobs;
    pthread_cond_init(&j->cond, NULL);
    j->refs = 1;
    *status = 400;
    j->sampling.logit_bias = NULL;
    j->sampling.n_logit_bias = 0;
    if (r->n_logit_bias > 0) {
        j->logit_bias = malloc((size_t)r->n_logit_bias * sizeof *j->logit_bias);
        if (!j->logit_bias) {
            snprintf(msg, cap, "out of memory");
            goto fail;
        }
        for (int i = 0; i < r->n_logit_bias; i++)
            if (r->logit_bias[i].token >= s->n_vocab) {
                snprintf(msg, cap, "logit_bias: token %d is outside the vocabulary (%d tokens)",
                         (int)r->logit_bias[i].token, s->n_vocab);
                goto fail;
            }
        memcpy(j->logit_bias, r->logit_bias, (size_t)r->n_logit_bias * sizeof *j->logit_bias);
        j->sampling.logit_bias = j->logit_bias;
        j->sampling.n_logit_bias = r->n_logit_bias;
    }
    /* each choice takes a reference on its adapter: an unload while the
     * request runs frees it only after */
    pthread_mutex_lock(&s->mu);
    int base_pick = adapter_by_name(s, r->model);
    if (r->lora_id >= 0) base_pick = r->lora_id < LP_SERVER_MAX_ADAPTERS && s->adapters[r->lora_id] ? r->lora_id : -2;
    for (int i = 0; i < j->n; i++) {
        int pick = r->choice_models[i] ? adapter_by_name(s, r->choice_models[i]) : base_pick;
        if (pick == -2) {
            pthread_mutex_unlock(&s->mu);
            *status = 404;
            snprintf(msg, cap, "the model '%.100s' does not exist (GET /v1/models lists the base and its adapters)",
                     r->choice_models[i] ? r->choice_models[i] : r->lora_id >= 0 ? "lora id" : r->model);
            goto fail;
        }
        srv_adapter *sa = pick >= 0 ? s->adapters[pick] : NULL;
        if (sa) sa->refs++;
        j->ch[i] = (choice){.job = j, .request = -1, .sa = sa, .adapter = sa ? sa->adapter : NULL,
                            .forecast = sa ? sa->forecast : s->base_forecast};
    }
    snprintf(j->model, sizeof j->model, "%s", base_pick >= 0 ? s->adapters[base_pick]->name : s->base_name);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < r->n_stop; i++) {
        j->stop[i] = strdup(r->stop[i]);
        if (!j->stop[i]) goto fail;
        j->n_stop++;
    }
    if (prompt_tokens(s, r, j, msg, cap)) goto fail;
    int room = s->n_ctx - j->n_prompt;
    j->max_tokens = r->max_tokens >= 0 ? r->max_tokens : s->p.max_tokens;
    if (j->max_tokens > s->p.max_tokens) j->max_tokens = s->p.max_tokens;
    if (j->max_tokens > room) j->max_tokens = room;
    j->seed_set = r->seed_set;
    return j;
fail:
    job_unref(j);
    return NULL;
}

static size_t token_piece(const void *model, int32_t token, char *buf, size_t cap) {
    return lp_token_to_piece(model, token, buf, cap);
}

/* Queues a job for the scheduler; false when the queue is full or the
 * server is stopping. */
static bool enqueue(server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    bool ok = !s->stopping && s->in_flight < s->p.max_queue + s->p.parallel;
    if (ok) {
        snprintf(j->id, sizeof j->id, "%s-%lld", j->kind == LP_API_CHAT ? "chatcmpl" : "cmpl",
                 (long long)++s->next_id);
        j->meta = (lp_api_meta){.kind = j->kind, .id = j->id, .model = j->model, .created = (int64_t)time(NULL),
                                .prompt_tokens = j->n_prompt, .logprobs = j->logprobs, .piece = token_piece,
                                .piece_user = s->model};
        if (!j->seed_set) j->sampling.seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)s->next_id * 7919u;
        j->refs++; /* the scheduler's */
        if (s->queue_tail) s->queue_tail->next = j;
        else s->queue_head = j;
        s->queue_tail = j;
        s->queued++;
        s->in_flight++;
        s->requests_total++;
        s->tokens_prompt += (uint64_t)j->n_prompt;
        for (int i = 0; i < j->n; i++)
            if (j->ch[i].sa) j->ch[i].sa->requests++;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* The log-probabilities of a choice's tokens not yet streamed (mu held). */
static lp_api_logprobs take_logprobs_locked(choice *c) {
    lp_api_logprobs lp = {.tokens = c->lps + c->lps_sent, .n = c->n_lps - c->lps_sent, .text_offset = c->lps_offset};
    for (int k = c->lps_sent; k < c->n_lps; k++) {
        char piece[256];
        size_t n = lp_token_to_piece(c->job->srv->model, c->lps[k].token, piece, sizeof piece);
        c->lps_offset += n < sizeof piece ? n : sizeof piece;
    }
    c->lps_sent = c->n_lps;
    return lp;
}

/* Stream chunks for whatever is new (called with mu held). */
static void fill_stream_locked(job *j) {
    bool all_ended = true;
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->ch[i];
        if (j->kind == LP_API_CHAT && !c->role_sent) {
            lp_api_chunk(&j->out, &j->meta, i, true, NULL, 0, NULL, NULL);
            c->role_sent = true;
        }
        size_t upto = c->done ? c->text.len : c->sent + lp_api_utf8_whole(c->text.data + c->sent, c->text.len - c->sent);
        if (upto > c->sent) {
            lp_api_logprobs lp = take_logprobs_locked(c);
            lp_api_chunk(&j->out, &j->meta, i, false, c->text.data + c->sent, upto - c->sent, NULL, &lp);
            c->sent = upto;
        }
        if (c->done && !c->end_sent) {
            /* tokens whose text a stop string held back come with the end */
            lp_api_logprobs lp = take_logprobs_locked(c);
            lp_api_chunk(&j->out, &j->meta, i, false, NULL, 0, c->finish, lp.n ? &lp : NULL);
            c->end_sent = true;
        }
        all_ended &= c->end_sent;
    }
    if (all_ended && !j->stream_ended) {
        int generated = 0;
        for (int i = 0; i < j->n; i++) generated += j->ch[i].n_generated;
        if (j->include_usage) lp_api_usage_chunk(&j->out, &j->meta, generated);
        lp_api_done(&j->out);
        j->stream_ended = true;
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    while (j->out_at == j->out.len) {
        j->out.len = j->out_at = 0;
        if (j->stream_ended) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        fill_stream_locked(j);
        if (j->out.failed) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (j->out.len == 0) pthread_cond_wait(&j->cond, &s->mu);
    }
    size_t n = j->out.len - j->out_at < max ? j->out.len - j->out_at : max;
    memcpy(buf, j->out.data + j->out_at, n);
    j->out_at += n;
    pthread_mutex_unlock(&s->mu);
    return (ssize_t)n;
}

/* The response is gone (finished, or the client left): cancel what runs. */
static void stream_free(void *cls) {
    job *j = cls;
    server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    if (j->n_done < j->n) {
        j->cancel = true;
        pthread_cond_signal(&s->work);
    }
    job_unref_locked(j);
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result respond_when_done(server *s, conn *cn, struct MHD_Connection *c, job *j) {
    lp_api_choice out[LP_API_MAX_N];
    pthread_mutex_lock(&s->mu);
    while (j->n_done < j->n) pthread_cond_wait(&j->cond, &s->mu);
    for (int i = 0; i < j->n; i++)
        out[i] = (lp_api_choice){.text = j->ch[i].text.data ? j->ch[i].text.data : "", .len = j->ch[i].text.len,
                                 .finish_reason = j->ch[i].finish, .n_generated = j->ch[i].n_generated,
                                 .logprobs = {.tokens = j->ch[i].lps, .n = j->ch[i].n_lps}};
    lp_sbuf b = {0};
    lp_api_response(&b, &j->meta, out, j->n);
    pthread_mutex_unlock(&s->mu);
    enum MHD_Result rc = send_json(cn, c, &b);
    lp_sbuf_free(&b);
    job_unref(j);
    return rc;
}

static enum MHD_Result route_completion(server *s, struct MHD_Connection *c, lp_api_kind kind, conn *cn) {
    char msg[512];
    lp_api_request r;
    if (lp_api_parse(cn->body.data ? cn->body.data : "", cn->body.len, kind, &r, msg, sizeof msg))
        return send_error(s, cn, c, 400, "invalid_request_error", msg);
    unsigned status = 400;
    job *j = make_job(s, &r, &status, msg, sizeof msg);
    lp_api_request_free(&r);
    if (!j) return send_error(s, cn, c, status, status == 404 ? "not_found_error" : "invalid_request_error", msg);
    if (!enqueue(s, j)) {
        job_unref(j);
        return send_error(s, cn, c, 503, "server_busy", "the server is busy (queue full) or stopping: retry later");
    }
    if (!j->stream) return respond_when_done(s, cn, c, j);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, j, stream_free);
    if (!resp) {
        stream_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    cn->status = 200;
    enum MHD_Result rc = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* llama.cpp's /tokenize and /detokenize (tests and tools find token ids
 * with them: logit_bias takes ids). */
static enum MHD_Result route_tokens(server *s, conn *cn, struct MHD_Connection *c, bool detokenize) {
    char msg[512];
    lp_api_tokens_request t;
    if (lp_api_parse_tokens(cn->body.data ? cn->body.data : "", cn->body.len, detokenize, &t, msg, sizeof msg))
        return send_error(s, cn, c, 400, "invalid_request_error", msg);
    lp_sbuf b = {0};
    lp_error err = {0};
    if (!detokenize) {
        size_t len = strlen(t.content);
        int cap = (int)(len + 8 < (size_t)1 << 24 ? len + 8 : (size_t)1 << 24);
        int32_t *ids = malloc((size_t)cap * sizeof *ids);
        int n = ids ? lp_tokenize(s->model, t.content, len, t.add_special && lp_model_add_bos(s->model), false, ids,
                                  cap, &err)
                    : -1;
        if (n < 0) {
            free(ids);
            lp_api_tokens_request_free(&t);
            snprintf(msg, sizeof msg, "cannot tokenize: %.300s", ids ? err.message : "out of memory");
            return send_error(s, cn, c, 400, "invalid_request_error", msg);
        }
        lp_sbuf_lit(&b, "{\"tokens\":[");
        for (int i = 0; i < n; i++) lp_sbuf_printf(&b, "%s%d", i ? "," : "", (int)ids[i]);
        lp_sbuf_lit(&b, "]}");
        free(ids);
    } else {
        lp_sbuf text = {0};
        for (int i = 0; i < t.n_tokens; i++) {
            if (t.tokens[i] >= s->n_vocab) {
                snprintf(msg, sizeof msg, "tokens[%d] = %d is outside the vocabulary (%d tokens)", i, (int)t.tokens[i],
                         s->n_vocab);
                lp_sbuf_free(&text);
                lp_api_tokens_request_free(&t);
                return send_error(s, cn, c, 400, "invalid_request_error", msg);
            }
            char piece[256];
            size_t n = lp_token_to_piece(s->model, t.tokens[i], piece, sizeof piece);
            lp_sbuf_add(&text, piece, n < sizeof piece ? n : sizeof piece);
        }
        /* pieces may end inside a character: the content is lossy there */
        bool whole = lp_utf8_valid((const uint8_t *)(text.data ? text.data : ""), text.len);
        lp_sbuf_lit(&b, "{\"content\":");
        lp_sbuf_json_string(&b, whole && text.data ? text.data : "", whole ? text.len : 0);
        lp_sbuf_lit(&b, "}");
        lp_sbuf_free(&text);
    }
    lp_api_tokens_request_free(&t);
    enum MHD_Result rc = send_json(cn, c, &b);
    lp_sbuf_free(&b);
    return rc;
}

/* The real path of a lora_path inside --adapter-dir (relative paths are
 * taken from there), symlinks resolved; anything that resolves outside, or
 * names "..", is refused. */
static bool adapter_path(const server *s, const char *path, char *out, char *msg, size_t cap) {
    char joined[2 * PATH_MAX];
    for (const char *p = path; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == path || p[-1] == '/') && (p[2] == 0 || p[2] == '/')) {
            snprintf(msg, cap, "lora_path: '..' is not allowed");
            return false;
        }
    snprintf(joined, sizeof joined, "%s%s%s", path[0] == '/' ? "" : s->adapter_dir, path[0] == '/' ? "" : "/", path);
    if (strlen(joined) >= PATH_MAX || !realpath(joined, out)) {
        snprintf(msg, cap, "lora_path: no such file under --adapter-dir");
        return false;
    }
    size_t n = strlen(s->adapter_dir);
    if (strncmp(out, s->adapter_dir, n) != 0 || out[n] != '/') {
        snprintf(msg, cap, "lora_path: resolves outside --adapter-dir (symlinks are followed); refused");
        return false;
    }
    return true;
}

/* Unlisted now, freed when its last request ends; the HTTP status. */
static unsigned unload_adapter(server *s, const char *name, char *msg, size_t cap) {
    pthread_mutex_lock(&s->mu);
    int i = adapter_by_name(s, name);
    if (i >= 0) {
        srv_adapter *a = s->adapters[i];
        s->adapters[i] = NULL;
        s->n_adapters--;
        s->unloads++;
        adapter_unref_locked(s, a);
    }
    pthread_mutex_unlock(&s->mu);
    if (i >= 0) return 200;
    snprintf(msg, cap, "no adapter '%.127s' is loaded", name);
    return 404;
}

/* Listed under a free entry (the first: its lora id); the HTTP status. */
static unsigned list_adapter(server *s, const char *name, lp_adapter *ad, char *msg, size_t cap) {
    srv_adapter *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(msg, cap, "out of memory");
        return 500;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    a->adapter = ad;
    a->refs = 1;
    unsigned status = 200;
    pthread_mutex_lock(&s->mu);
    int at = 0;
    while (at < LP_SERVER_MAX_ADAPTERS && s->adapters[at]) at++;
    if (adapter_by_name(s, name) != -2) {
        snprintf(msg, cap, "'%.127s' is already loaded (or is the base's name)", name);
        status = 400;
    } else if (at == LP_SERVER_MAX_ADAPTERS) {
        snprintf(msg, cap, "the server holds %d adapters already: unload one first", LP_SERVER_MAX_ADAPTERS);
        status = 400;
    } else {
        s->adapters[at] = a;
        s->n_adapters++;
        s->loads++;
    }
    pthread_mutex_unlock(&s->mu);
    if (status != 200) free(a);
    return status;
}

static unsigned load_adapter(server *s, const char *name, const char *path, char *msg, size_t cap) {
    char real[PATH_MAX];
    if (!adapter_path(s, path, real, msg, cap)) return 400;
    lp_error err = {0};
    /* loading reads the file and the (immutable) model only: no lock */
    lp_adapter *ad = lp_adapter_load(s->model, real, 1.0f, &err);
    if (!ad) {
        snprintf(msg, cap, "%.500s", err.message);
        return 400;
    }
    unsigned status = 400;
    if (lp_adapter_max_rank(ad) > s->max_rank)
        snprintf(msg, cap, "the adapter's rank %d is above this server's --max-lora-rank %d", lp_adapter_max_rank(ad),
                 s->max_rank);
    else status = list_adapter(s, name, ad, msg, cap);
    if (status != 200) lp_adapter_free(ad);
    return status;
}

/* vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter. */
static enum MHD_Result route_lora(server *s, conn *cn, struct MHD_Connection *c, bool load) {
    char msg[512];
    if (!s->adapter_dir[0])
        return send_error(s, cn, c, 400, "invalid_request_error",
                          "hot loading is off: start the server with --adapter-dir DIR");
    lp_api_lora_request q;
    if (lp_api_parse_lora(cn->body.data ? cn->body.data : "", cn->body.len, load, &q, msg, sizeof msg))
        return send_error(s, cn, c, 400, "invalid_request_error", msg);
    unsigned status = load ? load_adapter(s, q.name, q.path, msg, sizeof msg) : unload_adapter(s, q.name, msg, sizeof msg);
    lp_api_lora_request_free(&q);
    if (status != 200)
        return send_error(s, cn, c, status, status == 404 ? "not_found_error" : "invalid_request_error", msg);
    return send_body(cn, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

static enum MHD_Result dispatch(server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (get && (!strcmp(url, "/") || !strcmp(url, "/index.html")))
        return send_body(cn, c, 200, "text/html; charset=utf-8", (const char *)lp_server_page, lp_server_page_len);
    if (get && !strcmp(url, "/health")) return send_body(cn, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    if (get && !strcmp(url, "/metrics")) return route_metrics(s, cn, c);
    bool api = !strncmp(url, "/v1/", 4) || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize");
    if (api && !authorized(s, c)) return send_error(s, cn, c, 401, "authentication_error", "invalid or missing API key");
    if (cn->too_big) return send_error(s, cn, c, 413, "invalid_request_error", "the request body is too large");
    if (get && !strcmp(url, "/v1/models")) return route_models(s, cn, c);
    if (post && !strcmp(url, "/v1/chat/completions")) return route_completion(s, c, LP_API_CHAT, cn);
    if (post && !strcmp(url, "/v1/completions")) return route_completion(s, c, LP_API_COMPLETION, cn);
    if (post && !strcmp(url, "/v1/load_lora_adapter")) return route_lora(s, cn, c, true);
    if (post && !strcmp(url, "/v1/unload_lora_adapter")) return route_lora(s, cn, c, false);
    if (post && !strcmp(url, "/tokenize")) return route_tokens(s, cn, c, false);
    if (post && !strcmp(url, "/detokenize")) return route_tokens(s, cn, c, true);
    bool known = !strcmp(url, "/v1/models") || !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions");
    if (known) return send_error(s, cn, c, 405, "invalid_request_error", "method not allowed");
    return send_error(s, cn, c, 404, "not_found_error", "no such route");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    server *s = cls;
    conn *cn = *state;
    if (!cn) {
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->t0 = lp_now_seconds();
        snprintf(cn->what, sizeof cn->what, "%s %.140s", method, url);
        *state = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cn->body.len + *upload_size > s->p.max_body) cn->too_big = true;
        else lp_sbuf_add(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->body.failed) return send_error(s, cn, c, 500, "server_error", "out of memory");
    return dispatch(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode toe) {
    (void)c;
    server *s = cls;
    conn *cn = *state;
    if (!cn) return;
    if (!s->p.quiet)
        fprintf(stderr, "loraplex serve: %s %u %.1f ms%s\n", cn->what, cn->status, (lp_now_seconds() - cn->t0) * 1e3,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    lp_sbuf_free(&cn->body);
    free(cn);
    *state = NULL;
}

/* ---- start and stop ----------------------------------------------------------------------------- */

lp_server_params lp_server_default_params(void) {
    return (lp_server_params){
        .host = "127.0.0.1",
        .port = 8080,
        .parallel = 16,
        .max_queue = 64,
        .n_ctx = 0,
        .n_threads = 0,
        .max_tokens = 1024,
        .max_body = 8u << 20,
        .timeout_s = 600,
        .speculate = LP_SERVER_SPEC_OFF,
        .lookup_ngram = 3,
        .lookup_len = 8,
        .tree = {3, 2},
        .tree_depth = 2,
    };
}

static void base_name_of(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
}

/* --forecast NAME=PATH: each set checked against the base and bound to the
 * adapter NAME (or the base, by its name). */
static int bind_forecasts(server *s, lp_error *err) {
    for (int i = 0; i < s->p.n_forecasts; i++) {
        const char *name = s->p.forecast_names[i];
        int pick = adapter_by_name(s, name);
        if (pick == -2 || !name[0])
            return lp_error_set(err, LP_ERR_INVALID, "--forecast %s=%s: no adapter named '%s' (nor is it the base's name '%s')",
                                name, s->p.forecast_paths[i], name, s->base_name);
        lp_forecast **slot = pick >= 0 ? &s->adapters[pick]->forecast : &s->base_forecast;
        if (*slot) return lp_error_set(err, LP_ERR_INVALID, "--forecast %s: given twice", name);
        lp_forecast *f = lp_forecast_load(s->p.forecast_paths[i], err);
        if (!f) return -1;
        *slot = f;
        lp_error e = {0};
        if (lp_forecast_check(f, s->model, &e))
            return lp_error_set(err, e.status, "--forecast %s=%s: %s", name, s->p.forecast_paths[i], e.message);
    }
    return 0;
}

static int load(server *s, lp_error *err) {
    s->model = lp_model_load(s->p.model, NULL, err);
    if (!s->model) return -1;
    base_name_of(s->p.model, s->base_name, sizeof s->base_name);
    lp_model_info mi;
    lp_model_get_info(s->model, &mi);
    s->n_vocab = mi.n_vocab;
    s->has_template = strcmp(mi.chat_format, "none") != 0;
    if (s->p.adapter_dir && !realpath(s->p.adapter_dir, s->adapter_dir))
        return lp_error_set(err, LP_ERR_IO, "--adapter-dir %s: cannot resolve it", s->p.adapter_dir);
    for (int i = 0; i < s->p.n_adapters; i++) {
        const char *name = s->p.adapter_names[i];
        if (!lp_api_name_ok(name))
            return lp_error_set(err, LP_ERR_INVALID, "adapter name '%s': use 1 to 127 of [A-Za-z0-9._-]", name);
        if (!strcmp(name, s->base_name) || adapter_by_name(s, name) != -2)
            return lp_error_set(err, LP_ERR_INVALID, "adapter name '%s' is used twice (or is the base's)", name);
        srv_adapter *a = calloc(1, sizeof *a);
        if (!a) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
        snprintf(a->name, sizeof a->name, "%s", name);
        a->refs = 1; /* the table's */
        s->adapters[i] = a;
        a->adapter = lp_adapter_load(s->model, s->p.adapter_paths[i], 1.0f, err);
        if (!a->adapter) return -1;
        s->n_adapters++;
    }
    if (bind_forecasts(s, err)) return -1;
    bool spec = s->p.speculate != LP_SERVER_SPEC_OFF || s->p.n_forecasts > 0;
    lp_context_params cp = lp_context_default_params();
    cp.n_threads = s->p.n_threads;
    cp.max_sequences = 2 * s->p.parallel; /* half run, half keep cached prefixes */
    cp.max_logit_rows = s->p.parallel * 2 > 64 ? s->p.parallel * 2 : 64;
    /* speculating requests add tree and forecast rows with logits; rows
     * that do not fit are left out (fewer accepted, same output) */
    if (spec) cp.max_logit_rows = s->p.parallel * 32 > 512 ? 512 : s->p.parallel * 32 > 64 ? s->p.parallel * 32 : 64;
    if (s->p.n_forecasts > cp.max_embd_tables) cp.max_embd_tables = s->p.n_forecasts;
    cp.n_ctx = s->p.n_ctx > 0 ? s->p.n_ctx : 4096 * ((s->p.parallel + 3) / 4);
    /* hot loading: room for adapters that are not here yet */
    int slots = s->adapter_dir[0] ? 16 : 1;
    cp.max_adapters = s->n_adapters > slots ? s->n_adapters : slots;
    int rank = s->adapter_dir[0] ? 64 : 1;
    for (int i = 0; i < s->n_adapters; i++)
        if (lp_adapter_max_rank(s->adapters[i]->adapter) > rank) rank = lp_adapter_max_rank(s->adapters[i]->adapter);
    cp.max_adapter_rank = s->p.max_lora_rank > rank ? s->p.max_lora_rank : rank;
    s->ctx = lp_context_create(s->model, &cp, err);
    if (!s->ctx) return -1;
    lp_context_get_params(s->ctx, &cp);
    s->n_ctx = cp.max_seq_len;
    s->max_rank = cp.max_adapter_rank;
    /* the cost model: measured once, on an empty context, before the
     * scheduler starts */
    if (s->p.speculate == LP_SERVER_SPEC_AUTO) {
        int ctx_len = s->n_ctx / 2 < 64 ? s->n_ctx / 2 : 64;
        if (lp_speculate_measure_cost(s->ctx, ctx_len, s->pass_cost, LP_SPEC_COST_ROWS, err)) return -1;
        s->costed = true;
    }
    s->engine = lp_engine_create(s->ctx, NULL, err);
    return s->engine ? 0 : -1;
}

static void unload(server *s) {
    lp_engine_free(s->engine);
    /* every request has ended: only the table's references are left */
    for (int i = 0; i < LP_SERVER_MAX_ADAPTERS; i++)
        if (s->adapters[i]) adapter_unref_locked(s, s->adapters[i]);
    free_retired(s, s->retired);
    lp_context_free(s->ctx);
    lp_forecast_free(s->base_forecast);
    lp_model_free(s->model);
}

/* libmicrohttpd's messages: a client that leaves mid-stream makes it say
 * that it could not send the rest of a chunked body or its footers, which is
 * expected (the request is cancelled and logged as ended early); everything
 * else goes to stderr. */
static void http_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    if (!strncmp(line, "Failed to send the chunked response body", 40) || !strncmp(line, "Failed to send the footers", 26))
        return;
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n') line[--n] = 0;
    fprintf(stderr, "loraplex serve: http: %s\n", line);
}

static struct MHD_Daemon *start_http(server *s, lp_error *err) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->p.port)};
    if (inet_pton(AF_INET, s->p.host, &addr.sin_addr) != 1) {
        lp_error_set(err, LP_ERR_INVALID, "--host %s is not an IPv4 address", s->p.host);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_EXTERNAL_LOGGER, http_log, (void *)NULL, MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->p.max_queue + s->p.parallel + 32),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->p.timeout_s, MHD_OPTION_END);
    if (!d) lp_error_set(err, LP_ERR_IO, "cannot listen on %s:%d (in use?)", s->p.host, s->p.port);
    return d;
}

int lp_server_run(const lp_server_params *params, lp_error *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    s->p = *params;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    int rc = -1;
    /* signals are taken by sigwait below, so every thread started from
     * here on has them blocked */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    bool scheduler_started = false;
    if (load(s, err)) goto out;
    if (pthread_create(&s->scheduler, NULL, scheduler_main, s) != 0) {
        lp_error_set(err, LP_ERR_NOMEM, "cannot start the scheduler thread");
        goto out;
    }
    scheduler_started = true;
    int n_adapters = s->n_adapters; /* before connection threads may load more */
    s->daemon = start_http(s, err);
    if (!s->daemon) goto out;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "loraplex serve: %s with %d adapter%s, listening on http://%s:%u/\n", s->base_name, n_adapters,
            n_adapters == 1 ? "" : "s", s->p.host, info ? info->port : (unsigned)s->p.port);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "loraplex serve: signal %d, stopping\n", sig);
    rc = 0;
out:
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    if (scheduler_started) pthread_join(s->scheduler, NULL);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    unload(s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}
