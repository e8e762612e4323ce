/* The step-wise request engine: many requests over one context, one batch
 * per step. Built only on the public header, as any user's scheduler would
 * be; lp_generate, lp_generate_streams, the task evaluator and the server
 * drive it.
 *
 * A request's tokens are its prompt followed by what it generated. Its
 * sequence holds KV for the first n_kv of them; the rows it still needs
 * are tokens[n_kv .. n_tokens), the last one with logits, from which the
 * next token is sampled. Prefill, decode, recomputation after preemption
 * and a start from a cached prefix are all that one rule. */
#include "loraplex.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum req_state {
    REQ_QUEUED,    /* waiting for a sequence (and adapter slots) */
    REQ_RUNNING,   /* has a sequence; rows go into steps */
    REQ_DONE,
} req_state;

/* Output text not yet released to the callback: what might still turn out
 * to be the start of a stop string. */
typedef struct pending_text {
    char *buf;
    size_t len, cap;
} pending_text;

/* Candidate classes for acceptance estimates: forecast depth x rank (ranks
 * from 7 on pooled), then prompt lookup by chain and position along it,
 * then the corpus n-gram chain by position. */
#define SPEC_RANKS 8
#define SPEC_LOOKUP_CLASS (LP_SPEC_MAX_DEPTH * SPEC_RANKS)
#define SPEC_LOOKUP_POSITIONS 16
#define SPEC_LOOKUP_CHAINS 2
#define SPEC_NGRAM_CLASS (SPEC_LOOKUP_CLASS + SPEC_LOOKUP_CHAINS * SPEC_LOOKUP_POSITIONS)
#define SPEC_CLASSES (SPEC_NGRAM_CLASS + SPEC_LOOKUP_POSITIONS)
#define SPEC_EXPLORE 8 /* keep_worthwhile: passes without candidates before it tries one */

/* Acceptance counts of one task (adapter identity and forecast set): the
 * cost model's evidence, shared by the task's requests and kept across
 * them, so a new request starts from what earlier ones saw. Only speed
 * depends on them, never output. */
#define SPEC_ACCEPT_TABLES 16
typedef struct accept_table {
    uint64_t adapter_id;
    const lp_forecast *forecast;
    int64_t used_at;                 /* 0: free */
    int32_t tried[SPEC_CLASSES];     /* candidates of a class whose parent was accepted ... */
    int32_t hit[SPEC_CLASSES];       /* ... and of them the accepted */
} accept_table;

typedef struct request {
    bool used;             /* this table entry holds a request */
    req_state state;
    lp_request spec;       /* as submitted; prompt, stop and text pointers not kept */
    int32_t *tokens;       /* [cap] prompt, then generated tokens */
    int n_tokens, cap;
    char **stop;           /* [n_stop] copies */
    lp_sampler *own_sampler, *sampler;
    uint64_t id_main, id_prefix;  /* adapter identities (0 = base) */
    int seq;               /* -1 while queued */
    int slot, slot_prefix; /* context adapter slots while running */
    int n_kv;              /* tokens whose KV its sequence holds */
    int64_t order;         /* admission order: the youngest is preempted first */
    int64_t submitted;     /* submission order: the queue is served in it */
    int64_t preempted_at;  /* the step it was last preempted in (+1; 0: never) */
    int leader;            /* request whose prefix this one waits to share (-1) */
    int wait_len;          /* ... until that one holds this many entries */
    pending_text text;
    lp_request_stats stats;
    /* speculative decoding (spec.speculate, copied into sp) */
    bool speculating;
    lp_speculate sp;
    int table;             /* embedding table its forecast set is bound as (0: none) */
    int n_cand;            /* candidate tree for the next verification: */
    int32_t cand_tok[LP_SPEC_MAX_NODES];
    int cand_parent[LP_SPEC_MAX_NODES]; /* an earlier candidate, -1: the root */
    int cand_depth[LP_SPEC_MAX_NODES];  /* 1: a child of the root */
    int root_row;          /* this step: the row whose logits give its next token (-1) */
    int cand_row[LP_SPEC_MAX_NODES];    /* this step: a candidate's row (-1: not placed) */
    int fc_row[LP_SPEC_MAX_NODES + 1];  /* this step: first forecast row after the root
                                           ([0]) or candidate i ([i + 1]); -1: none */
    int step_depth;        /* this step: forecast rows in each of those chains */
    uint8_t cand_class[LP_SPEC_MAX_NODES]; /* where a candidate came from (SPEC_CLASSES) */
    int lookup_anchor;     /* the history position the last lookup chain copied from */
    int accept;            /* its entry in the engine's acceptance table */
    int pruned_passes;     /* passes in a row the cost model placed no candidate */
    lp_spec_stats spec_stats;
} request;

typedef struct seq_state {
    int owner;             /* running request, or -1 */
    int64_t used_at;       /* last use, for evicting idle cached prefixes (LRU) */
} seq_state;

struct lp_engine {
    lp_context *ctx;
    const lp_model *model;
    lp_engine_params params;
    int n_vocab, max_rows, max_logit_rows, max_seq_len;
    request *req;          /* [n_req] table; ids index it */
    int n_req;
    request **running;     /* [n_req] scratch: running requests by admission order */
    seq_state *seqs;       /* [n_seqs], sequence first_seq + i */
    lp_row *rows;          /* [max_rows] the step's batch */
    int *row_req;          /* [max_rows] the request a row belongs to */
    int64_t clock, next_order, next_submitted;
    int64_t n_steps, n_rows_total;
    int n_tables;          /* the context's embedding tables ... */
    const lp_forecast **table_of; /* [n_tables + 1] ... and the forecast set the
                                     engine bound to each (NULL: none) */
    accept_table accept[SPEC_ACCEPT_TABLES];
    int64_t accept_clock;
};


lp_request lp_request_default(void) {
    return (lp_request){
        .sampling = lp_sampler_default_params(),
        .max_tokens = 128,
        .stop_at_eog = true,
        .first_token = -1,
    };
}

lp_engine_params lp_engine_default_params(void) { return (lp_engine_params){0}; }

/* ---- creation ------------------------------------------------------------------ */

lp_engine *lp_engine_create(lp_context *ctx, const lp_engine_params *params, lp_error *err) {
    lp_context_params cp;
    lp_engine *e = calloc(1, sizeof *e);
    if (!e) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory for an engine");
        return NULL;
    }
    e->ctx = ctx;
    e->model = lp_context_model(ctx);
    e->params = params ? *params : lp_engine_default_params();
    lp_context_get_params(ctx, &cp);
    lp_model_info info;
    lp_model_get_info(e->model, &info);
    e->n_vocab = info.n_vocab;
    e->max_rows = cp.max_rows;
    e->max_logit_rows = cp.max_logit_rows;
    e->max_seq_len = cp.max_seq_len;
    lp_engine_params *p = &e->params;
    if (p->first_seq < 0 || p->first_seq >= cp.max_sequences || p->n_seqs < 0 ||
        p->first_seq + p->n_seqs > cp.max_sequences) {
        lp_error_set(err, LP_ERR_INVALID, "engine sequences %d..%d are outside the context's 0..%d", p->first_seq,
             p->first_seq + p->n_seqs - 1, cp.max_sequences - 1);
        free(e);
        return NULL;
    }
    if (p->n_seqs == 0) p->n_seqs = cp.max_sequences - p->first_seq;
    if (p->min_shared <= 0) p->min_shared = 16;
    if (p->max_prefill_rows <= 0 || p->max_prefill_rows > cp.max_rows) p->max_prefill_rows = cp.max_rows;
    e->seqs = calloc((size_t)p->n_seqs, sizeof *e->seqs);
    e->rows = calloc((size_t)cp.max_rows, sizeof *e->rows);
    e->row_req = calloc((size_t)cp.max_rows, sizeof *e->row_req);
    e->n_tables = cp.max_embd_tables > 0 ? cp.max_embd_tables : 0;
    e->table_of = calloc((size_t)e->n_tables + 1, sizeof *e->table_of);
    if (!e->seqs || !e->rows || !e->row_req || !e->table_of) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory for an engine");
        lp_engine_free(e);
        return NULL;
    }
    for (int i = 0; i < p->n_seqs; i++) e->seqs[i].owner = -1; /* any KV there is a cached prefix */
    return e;
}

static void request_clear(request *r) {
    free(r->tokens);
    for (int i = 0; r->stop && i < r->spec.n_stop; i++) free(r->stop[i]);
    free(r->stop);
    lp_sampler_free(r->own_sampler);
    free(r->text.buf);
    memset(r, 0, sizeof *r);
}

/* Table t's embeddings and KV prefix are forecast set f's (NULL: none). */
static int bind_table(lp_engine *e, int t, const lp_forecast *f) {
    return lp_context_bind_embeddings(e->ctx, t, f ? lp_forecast_data(f) : NULL, f ? lp_forecast_k(f) : 0, NULL) ||
           lp_context_bind_kv_prefix(e->ctx, t, lp_forecast_prefix(f), lp_forecast_prefix_len(f), NULL);
}

void lp_engine_free(lp_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_req; i++) {
        request *r = &e->req[i];
        if (r->used && r->state == REQ_RUNNING) lp_seq_clear(e->ctx, r->seq);
        request_clear(r);
    }
    for (int t = 1; e->table_of && t <= e->n_tables; t++)
        if (e->table_of[t]) bind_table(e, t, NULL);
    free(e->table_of);
    free(e->req);
    free(e->running);
    free(e->seqs);
    free(e->rows);
    free(e->row_req);
    free(e);
}

/* ---- submission ----------------------------------------------------------------- */

static request *get(const lp_engine *e, int id) {
    return id >= 0 && id < e->n_req && e->req[id].used ? &e->req[id] : NULL;
}

static int new_entry(lp_engine *e, lp_error *err) {
    for (int i = 0; i < e->n_req; i++)
        if (!e->req[i].used) return i;
    int n = e->n_req ? e->n_req * 2 : 16;
    request **run = realloc(e->running, (size_t)n * sizeof *run);
    if (run) e->running = run;
    request *t = run ? realloc(e->req, (size_t)n * sizeof *t) : NULL;
    if (!t) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for requests");
    memset(t + e->n_req, 0, (size_t)(n - e->n_req) * sizeof *t);
    e->req = t;
    int id = e->n_req;
    e->n_req = n;
    return id;
}

static int copy_prompt(lp_engine *e, request *r, const lp_request *q, lp_error *err) {
    int n = q->n_prompt;
    if (!q->prompt && q->text) {
        size_t len = strlen(q->text);
        n = lp_tokenize(e->model, q->text, len, lp_model_add_bos(e->model), true, NULL, 0, err);
        if (n < 0) return -1;
    }
    if (n < 1) return lp_error_set(err, LP_ERR_INVALID, "the request's prompt is empty (no tokens)");
    if (n > e->max_seq_len)
        return lp_error_set(err, LP_ERR_KV_FULL, "a prompt of %d tokens does not fit a sequence (%d)", n,
                    e->max_seq_len);
    int extra = q->max_tokens > 0 ? q->max_tokens : 0;
    if (extra > e->max_seq_len) extra = e->max_seq_len;
    r->cap = n + extra + 1;
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    if (!r->tokens) return lp_error_set(err, LP_ERR_NOMEM, "out of memory for a prompt of %d tokens", n);
    if (q->prompt) {
        memcpy(r->tokens, q->prompt, (size_t)n * sizeof(int32_t));
    } else if (lp_tokenize(e->model, q->text, strlen(q->text), lp_model_add_bos(e->model), true, r->tokens, n,
                           err) != n) {
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= e->n_vocab)
            return lp_error_set(err, LP_ERR_INVALID, "prompt token %d (%d) is outside the vocabulary", i, r->tokens[i]);
    r->n_tokens = n;
    r->stats.n_prompt = n;
    return 0;
}

static int copy_stops(request *r, const lp_request *q, lp_error *err) {
    if (q->n_stop < 0 || (q->n_stop > 0 && !q->stop)) return lp_error_set(err, LP_ERR_INVALID, "bad stop list");
    if (q->n_stop == 0) return 0;
    r->stop = calloc((size_t)q->n_stop, sizeof *r->stop);
    if (!r->stop) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < q->n_stop; i++) {
        if (!q->stop[i]) return lp_error_set(err, LP_ERR_INVALID, "stop string %d is NULL", i);
        r->stop[i] = strdup(q->stop[i]);
        if (!r->stop[i]) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    }
    return 0;
}

static void finish(lp_engine *e, request *r, const char *reason, lp_status status);

lp_speculate lp_speculate_default(void) { return (lp_speculate){0}; }

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of a forward of the first n rows (never committed). */
static double time_rows(lp_context *ctx, const lp_row *rows, int n, lp_error *err) {
    double t[9];
    for (int k = 0; k < 9; k++) {
        double t0 = seconds_now();
        if (lp_forward(ctx, rows, n, err)) return -1;
        t[k] = seconds_now() - t0;
    }
    qsort(t, 9, sizeof *t, by_value);
    return t[4];
}

int lp_speculate_measure_cost(lp_context *ctx, int ctx_len, float *cost, int n, lp_error *err) {
    lp_context_params cp;
    lp_context_get_params(ctx, &cp);
    int seq = cp.max_sequences - 1, measured = n < cp.max_logit_rows ? n : cp.max_logit_rows;
    if (n < 2 || n > LP_SPEC_COST_ROWS || ctx_len < 1 || ctx_len + n > cp.max_seq_len || measured > cp.max_rows ||
        ctx_len > cp.max_rows)
        return lp_error_set(err, LP_ERR_INVALID, "measure_cost: %d rows (2..%d) after %d tokens do not fit the context",
                            n, LP_SPEC_COST_ROWS, ctx_len);
    if (lp_seq_length(ctx, seq) != 0)
        return lp_error_set(err, LP_ERR_INVALID, "measure_cost: sequence %d is in use", seq);
    lp_row *rows = malloc((size_t)(ctx_len > measured ? ctx_len : measured) * sizeof *rows);
    if (!rows) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ctx_len; i++)
        rows[i] = (lp_row){.token = i % 7 + 1, .pos = i, .seq = seq, .parent = i - 1, .commit = true};
    rows[ctx_len - 1].logits = true;
    int rc = lp_forward(ctx, rows, ctx_len, err);
    for (int i = 0; i < measured && !rc; i++)
        rows[i] = (lp_row){.token = i % 7 + 1, .pos = ctx_len + i, .seq = seq, .parent = i - 1, .logits = true};
    double one = rc ? -1 : time_rows(ctx, rows, 1, err);
    one = rc || one < 0 ? -1 : time_rows(ctx, rows, 1, err); /* the first was a warm-up */
    rc = one > 0 ? 0 : -1;
    cost[0] = 1;
    for (int r = 2; r <= measured && !rc; r++) {
        double t = time_rows(ctx, rows, r, err);
        if (t < 0) rc = -1;
        else cost[r - 1] = (float)(t / one);
    }
    /* past the logit rows: on with the last measured slope; never cheaper with more rows */
    for (int r = measured + 1; r <= n && !rc; r++)
        cost[r - 1] = cost[r - 2] + (measured > 1 ? cost[measured - 1] - cost[measured - 2] : 1.0f);
    for (int r = 1; r < n && !rc; r++)
        if (cost[r] < cost[r - 1]) cost[r] = cost[r - 1];
    lp_seq_truncate(ctx, seq, 0, NULL);
    free(rows);
    return rc;
}

/* The task's acceptance table, a new one (the least recently used one
 * cleared) if it has none. Counts are capped by halving, so old evidence
 * fades as a task's text changes. */
static int accept_table_for(lp_engine *e, uint64_t adapter_id, const lp_forecast *f) {
    int lru = 0;
    for (int i = 0; i < SPEC_ACCEPT_TABLES; i++) {
        accept_table *t = &e->accept[i];
        if (t->used_at && t->adapter_id == adapter_id && t->forecast == f) {
            t->used_at = ++e->accept_clock;
            return i;
        }
        if (t->used_at < e->accept[lru].used_at) lru = i;
    }
    e->accept[lru] = (accept_table){.adapter_id = adapter_id, .forecast = f, .used_at = ++e->accept_clock};
    return lru;
}

static bool greedy(const lp_sampler *s) { return lp_sampler_get_params(s).temperature <= 0.0f; }

/* A borrowed sampler another unfinished request uses, where either of the
 * two speculates and the sampler draws: speculation draws several tokens
 * of one request in one step, so the two requests' draws would interleave
 * differently from plain decoding. */
static int shared_sampler(const lp_engine *e, const lp_request *q, lp_error *err) {
    if (!q->sampler || greedy(q->sampler)) return 0;
    for (int i = 0; i < e->n_req; i++) {
        const request *o = &e->req[i];
        if (o->used && o->state != REQ_DONE && o->sampler == q->sampler && (o->speculating || q->speculate))
            return lp_error_set(err, LP_ERR_INVALID,
                                "a sampling sampler is shared with request %d and one of the two decodes "
                                "speculatively: give each its own sampler", i);
    }
    return 0;
}

/* Speculation settings a request may carry. Sampling is allowed with a
 * sampler of its own (shared_sampler): spec_after draws each token from
 * the node's exact logits in order, one draw per token as plain decoding
 * does, so the output is the plain sampler's token for token for a seed. */
static int check_speculate(const lp_engine *e, const lp_request *q, lp_error *err) {
    const lp_speculate *sp = q->speculate;
    if (q->token_fn)
        return lp_error_set(err, LP_ERR_INVALID,
                            "log-probabilities (token_fn) are not reported under speculative decoding yet");
    int k = sp->forecast ? lp_forecast_k(sp->forecast) : 0;
    if (sp->forecast && lp_forecast_check(sp->forecast, e->model, err)) return -1;
    if (sp->depth < 0 || sp->depth > LP_SPEC_MAX_DEPTH || sp->depth > k)
        return lp_error_set(err, LP_ERR_INVALID, "speculation depth %d: the forecast set has %d embeddings (at most %d)",
                            sp->depth, k, LP_SPEC_MAX_DEPTH);
    for (int d = 0; d < sp->depth; d++)
        if (sp->branches[d] < 1 || sp->branches[d] > LP_SPEC_MAX_NODES)
            return lp_error_set(err, LP_ERR_INVALID, "speculation branches[%d] = %d (1..%d)", d, sp->branches[d],
                                LP_SPEC_MAX_NODES);
    if (sp->lookup_ngram < 0 || sp->lookup_ngram > 16 || sp->lookup_len < 0 || sp->lookup_len > LP_SPEC_MAX_NODES ||
        (sp->lookup_ngram > 0) != (sp->lookup_len > 0))
        return lp_error_set(err, LP_ERR_INVALID, "prompt lookup: n-gram %d (1..16) and length %d (1..%d) go together",
                            sp->lookup_ngram, sp->lookup_len, LP_SPEC_MAX_NODES);
    if (sp->ngram_len > LP_SPEC_MAX_NODES)
        return lp_error_set(err, LP_ERR_INVALID, "speculation ngram_len %d (at most %d)", sp->ngram_len,
                            LP_SPEC_MAX_NODES);
    if (sp->max_nodes < 0 || sp->max_nodes > LP_SPEC_MAX_NODES)
        return lp_error_set(err, LP_ERR_INVALID, "speculation max_nodes %d (0..%d)", sp->max_nodes, LP_SPEC_MAX_NODES);
    bool any = false;
    for (int i = 0; i < LP_SPEC_COST_ROWS; i++) any |= sp->pass_cost[i] != 0;
    for (int i = 0; any && i < LP_SPEC_COST_ROWS; i++)
        if (!(sp->pass_cost[i] > 0 && sp->pass_cost[i] < 1e6f) || (i > 0 && sp->pass_cost[i] < sp->pass_cost[i - 1]))
            return lp_error_set(err, LP_ERR_INVALID, "speculation pass_cost[%d] = %g: costs are positive, finite and "
                                "non-decreasing (or all 0: no cost model)", i, (double)sp->pass_cost[i]);
    return 0;
}

int lp_engine_submit(lp_engine *e, const lp_request *q, lp_error *err) {
    if (!q) return lp_error_set(err, LP_ERR_INVALID, "no request");
    if (q->n_prefix < 0) return lp_error_set(err, LP_ERR_INVALID, "n_prefix %d is negative", q->n_prefix);
    if (q->max_tokens < 0) return lp_error_set(err, LP_ERR_INVALID, "max_tokens %d is negative", q->max_tokens);
    if (q->top_logprobs < 0 || q->top_logprobs > LP_MAX_TOP_LOGPROBS)
        return lp_error_set(err, LP_ERR_INVALID, "top_logprobs %d: must be 0 to %d", q->top_logprobs,
                            LP_MAX_TOP_LOGPROBS);
    if (q->first_token >= e->n_vocab)
        return lp_error_set(err, LP_ERR_INVALID, "first_token %d is outside the vocabulary", q->first_token);
    if (shared_sampler(e, q, err)) return -1;
    int id = new_entry(e, err);
    if (id < 0) return -1;
    request *r = &e->req[id];
    r->used = true;
    r->spec = *q;
    r->spec.prompt = NULL;
    r->spec.text = NULL;
    r->spec.stop = NULL;
    r->seq = r->leader = -1;
    r->stats.seq = -1;
    r->id_main = lp_adapter_identity(q->adapter);
    r->id_prefix = lp_adapter_identity(q->prefix_adapter);
    r->sampler = q->sampler;
    r->spec.speculate = NULL;
    r->root_row = -1;
    if (q->speculate) {
        if (check_speculate(e, q, err)) goto bad;
        r->speculating = true;
        r->sp = *q->speculate;
        r->accept = accept_table_for(e, r->id_main, r->sp.forecast);
        if (r->sp.max_nodes <= 0) r->sp.max_nodes = LP_SPEC_MAX_NODES;
    }
    if (copy_prompt(e, r, q, err) || copy_stops(r, q, err)) goto bad;
    if (!r->sampler) {
        r->own_sampler = lp_sampler_create(e->model, &q->sampling, err);
        if (!r->own_sampler) goto bad;
        r->sampler = r->own_sampler;
    }
    r->state = REQ_QUEUED;
    r->submitted = e->next_submitted++;
    if (q->max_tokens == 0) finish(e, r, "length", LP_OK);
    return id;
bad:
    request_clear(r);
    return -1;
}

/* ---- adapters and sequences ------------------------------------------------------ */

/* Identity of the adapter position pos of a request is computed with. */
static uint64_t identity_at(const request *r, int pos) {
    return pos < r->spec.n_prefix ? r->id_prefix : r->id_main;
}

static bool slot_in_use(const lp_engine *e, int slot) {
    for (int i = 0; i < e->n_req; i++) {
        const request *r = &e->req[i];
        if (r->used && r->state == REQ_RUNNING && (r->slot == slot || r->slot_prefix == slot)) return true;
    }
    return false;
}

/* A slot with the adapter bound (binding it to a free one if needed);
 * 0 for the base; -1 if every slot serves another running request; -2 if
 * the context cannot take the adapter (err says why). */
static int slot_for(lp_engine *e, const lp_adapter *a, int avoid, lp_error *err) {
    if (!a) return 0;
    int n = lp_context_n_slots(e->ctx), free_slot = -1;
    for (int s = 1; s <= n; s++) {
        if (lp_context_slot_adapter(e->ctx, s) == a) return s;
        if (free_slot < 0 && s != avoid && !slot_in_use(e, s)) free_slot = s;
    }
    if (free_slot < 0) return -1;
    if (lp_context_bind_adapter(e->ctx, free_slot, a, err) != 0) return -2;
    return free_slot;
}

/* Entries of sequence seq that equal request r's tokens, with their
 * adapter identities, from the start (at most limit). */
static int match_seq(const lp_engine *e, int seq, const request *r, int limit) {
    int k = 0;
    int32_t tok;
    uint64_t id;
    while (k < limit && lp_seq_entry(e->ctx, seq, k, &tok, &id) == 0 && tok == r->tokens[k] &&
           id == identity_at(r, k))
        k++;
    return k;
}

/* Leading tokens two requests' prompts share, computed alike. */
static int match_prompts(const request *a, const request *b, int limit) {
    int k = 0;
    while (k < limit && k < a->stats.n_prompt && k < b->stats.n_prompt && a->tokens[k] == b->tokens[k] &&
           identity_at(a, k) == identity_at(b, k))
        k++;
    return k;
}

static int seq_index(const lp_engine *e, int seq) { return seq - e->params.first_seq; }

/* A sequence with nothing in it, evicting the least recently used idle
 * cached prefix if none is empty; -1 if every one serves a request. */
static int free_seq(lp_engine *e, int keep) {
    int lru = -1;
    for (int i = 0; i < e->params.n_seqs; i++) {
        int seq = e->params.first_seq + i;
        if (e->seqs[i].owner >= 0 || seq == keep) continue;
        if (lp_seq_length(e->ctx, seq) == 0) return seq;
        if (lru < 0 || e->seqs[i].used_at < e->seqs[lru].used_at) lru = i;
    }
    if (lru < 0) return -1;
    lp_seq_clear(e->ctx, e->params.first_seq + lru);
    return e->params.first_seq + lru;
}

/* Frees the least recently used idle cached prefix other than `keep`. */
static bool evict_one_cached(lp_engine *e, int keep) {
    int lru = -1;
    for (int i = 0; i < e->params.n_seqs; i++)
        if (e->seqs[i].owner < 0 && e->params.first_seq + i != keep &&
            lp_seq_length(e->ctx, e->params.first_seq + i) > 0 &&
            (lru < 0 || e->seqs[i].used_at < e->seqs[lru].used_at))
            lru = i;
    if (lru < 0) return false;
    lp_seq_clear(e->ctx, e->params.first_seq + lru);
    return true;
}

/* Whether r should wait for a running request that is computing a longer
 * shared prefix than any sequence holds yet (then it forks it later). */
static bool wait_for_leader(lp_engine *e, request *r, int have) {
    int limit = r->n_tokens - 1;
    for (int i = 0; i < e->n_req; i++) {
        request *l = &e->req[i];
        if (!l->used || l->state != REQ_RUNNING || l == r) continue;
        int common = match_prompts(l, r, limit);
        if (common >= have + e->params.min_shared && l->n_kv < common) {
            r->leader = i;
            r->wait_len = common;
            return true;
        }
    }
    return false;
}

typedef enum admission { ADMITTED, WAITING, NO_ROOM } admission;

/* Blocks free in the KV cache. */
static int free_blocks(const lp_engine *e, int *block_tokens) {
    int used, total;
    lp_kv_usage(e->ctx, &used, &total, block_tokens);
    return total - used;
}

/* Gives a queued request a sequence, starting from the longest cached or
 * running prefix it matches. WAITING: it will share a prefix another
 * request is computing; NO_ROOM: no sequence, slot or KV room yet. */
static admission admit(lp_engine *e, int id) {
    request *r = &e->req[id];
    /* not back in the step that made room by dropping it */
    if (r->preempted_at == e->n_steps + 1) return NO_ROOM;
    if (r->leader >= 0) {
        const request *l = &e->req[r->leader];
        if (l->used && l->state == REQ_RUNNING && l->n_kv < r->wait_len) return WAITING;
        r->leader = -1;
    }
    int limit = r->n_tokens - 1; /* the last token's row is needed for its logits */
    int best = -1, best_len = 0;
    for (int i = 0; !r->spec.no_reuse && i < e->params.n_seqs; i++) {
        int seq = e->params.first_seq + i, len = match_seq(e, seq, r, limit);
        if (len > best_len) {
            best = seq;
            best_len = len;
        }
    }
    if (!r->spec.no_reuse && r->stats.n_preempted == 0 && wait_for_leader(e, r, best_len)) return WAITING;
    /* room for its first chunk, so it is not admitted only to be preempted */
    int bt, room = free_blocks(e, &bt), chunk = r->n_tokens - best_len;
    if (chunk > e->params.max_prefill_rows) chunk = e->params.max_prefill_rows;
    if (room < (chunk + bt - 1) / bt + 1 && !evict_one_cached(e, best)) return NO_ROOM;
    lp_error err = {0};
    int slot = slot_for(e, r->spec.adapter, -1, &err);
    int slot_prefix = slot < 0 || r->spec.n_prefix == 0 ? slot : slot_for(e, r->spec.prefix_adapter, slot, &err);
    if (slot == -2 || slot_prefix == -2) {
        finish(e, r, "error", LP_ERR_INVALID);
        return ADMITTED;
    }
    if (slot < 0 || slot_prefix < 0) return NO_ROOM;
    int seq;
    if (best >= 0 && e->seqs[seq_index(e, best)].owner < 0) {
        seq = best; /* an idle cached prefix: take it over */
    } else {
        seq = free_seq(e, best);
        if (seq < 0) return NO_ROOM;
        if (best >= 0 && lp_seq_fork(e->ctx, best, seq, NULL) != 0) return NO_ROOM;
    }
    if (lp_seq_truncate(e->ctx, seq, best_len, NULL) != 0) return NO_ROOM;
    e->seqs[seq_index(e, seq)].owner = id;
    r->seq = r->stats.seq = seq;
    r->slot = slot;
    r->slot_prefix = slot_prefix;
    r->n_kv = best_len;
    if (r->stats.n_preempted == 0) r->stats.n_reused = best_len;
    r->order = e->next_order++;
    r->state = REQ_RUNNING;
    return ADMITTED;
}

/* In submission order, until one finds no room (the queue is fair: a
 * later request does not overtake one that waits for room). */
static void admit_queued(lp_engine *e) {
    int64_t after = -1;
    for (;;) {
        int next = -1;
        for (int i = 0; i < e->n_req; i++) {
            const request *r = &e->req[i];
            if (r->used && r->state == REQ_QUEUED && r->submitted > after &&
                (next < 0 || r->submitted < e->req[next].submitted))
                next = i;
        }
        if (next < 0) return;
        after = e->req[next].submitted;
        if (admit(e, next) == NO_ROOM) return;
    }
}

/* Leaves a request's sequence: kept as a cached prefix or cleared. */
static void release_seq(lp_engine *e, request *r, bool keep) {
    if (r->seq < 0) return;
    seq_state *s = &e->seqs[seq_index(e, r->seq)];
    s->owner = -1;
    s->used_at = ++e->clock;
    if (!keep) lp_seq_clear(e->ctx, r->seq);
    r->seq = -1;
}

/* Unbinds a done request's forecast set unless another request uses it. */
static void release_table(lp_engine *e, request *r) {
    if (!r->speculating || !r->sp.forecast) return;
    for (int i = 0; i < e->n_req; i++) {
        const request *o = &e->req[i];
        if (o != r && o->used && o->state != REQ_DONE && o->speculating && o->sp.forecast == r->sp.forecast) return;
    }
    for (int t = 1; t <= e->n_tables; t++)
        if (e->table_of[t] == r->sp.forecast) {
            bind_table(e, t, NULL);
            e->table_of[t] = NULL;
        }
    r->table = 0;
}

static void finish(lp_engine *e, request *r, const char *reason, lp_status status) {
    if (r->state == REQ_DONE) return;
    bool cancelled = status == LP_ERR_CANCELLED;
    /* a stop string's text is dropped; anything else held back is released */
    if (!cancelled && strcmp(reason, "stop") != 0 && r->text.len > 0 && r->spec.fn)
        r->spec.fn(r->spec.user, (int)(r - e->req), r->text.buf, r->text.len);
    r->text.len = 0;
    release_seq(e, r, r->state == REQ_RUNNING && !r->spec.drop_kv && !cancelled && status == LP_OK);
    r->state = REQ_DONE;
    release_table(e, r);
    r->stats.done = true;
    r->stats.stop_reason = reason;
    r->stats.status = status;
}

/* Drops the youngest running request's KV and queues it again; it will
 * recompute its tokens and go on exactly where it was. */
static bool preempt_youngest(lp_engine *e) {
    request *y = NULL;
    int running = 0;
    for (int i = 0; i < e->n_req; i++) {
        request *r = &e->req[i];
        if (!r->used || r->state != REQ_RUNNING) continue;
        running++;
        if (!y || r->order > y->order) y = r;
    }
    if (!y) return false;
    if (running == 1) {
        finish(e, y, "context", LP_ERR_KV_FULL); /* it does not fit even alone */
        return true;
    }
    release_seq(e, y, false);
    y->preempted_at = e->n_steps + 1;
    y->state = REQ_QUEUED;
    y->n_kv = 0;
    y->stats.n_preempted++;
    return true;
}

/* ---- text ----------------------------------------------------------------------------- */

static bool pending_append(pending_text *p, const char *s, size_t n) {
    if (p->len + n + 1 > p->cap) {
        size_t cap = (p->len + n + 1) * 2;
        char *b = realloc(p->buf, cap);
        if (!b) return false;
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = 0;
    return true;
}

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t held_back(const char *text, size_t len, char *const *stop, int n_stop) {
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && memcmp(text + len - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Offset of the earliest stop string in text, or -1. */
static long find_stop(const char *text, size_t len, char *const *stop, int n_stop) {
    long best = -1;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        if (sl == 0 || sl > len) continue;
        for (size_t at = 0; at + sl <= len; at++)
            if (memcmp(text + at, stop[i], sl) == 0) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

/* The nth most likely token of logits (0 = the best; ties by id) and its probability. */
static int32_t nth_best(const float *logits, int n_vocab, int nth, float *prob) {
    int32_t best[64] = {0};
    int have = 0;
    if (nth >= 64) nth = 63;
    for (int32_t t = 0; t < n_vocab; t++) {
        if (have == nth + 1 && logits[t] <= logits[best[nth]]) continue;
        int pos = have <= nth ? have++ : nth;
        while (pos > 0 && logits[best[pos - 1]] < logits[t]) {
            best[pos] = best[pos - 1];
            pos--;
        }
        best[pos] = t;
    }
    float max = logits[best[0]], sum = 0;
    for (int t = 0; t < n_vocab; t++) sum += expf(logits[t] - max);
    int32_t pick = best[have - 1 < nth ? have - 1 : nth];
    *prob = expf(logits[pick] - max) / sum;
    return pick;
}

/* Streams a new token's text, holding back what may start a stop string. */
static int emit(lp_engine *e, request *r, int32_t tok, lp_error *err) {
    char piece[256];
    size_t len = lp_token_to_piece(e->model, tok, piece, sizeof piece);
    if (len > sizeof piece) len = sizeof piece;
    if (!pending_append(&r->text, piece, len)) return lp_error_set(err, LP_ERR_NOMEM, "out of memory");
    int id = (int)(r - e->req);
    long at = find_stop(r->text.buf, r->text.len, r->stop, r->spec.n_stop);
    if (at >= 0) {
        if (r->spec.fn && at > 0) r->spec.fn(r->spec.user, id, r->text.buf, (size_t)at);
        finish(e, r, "stop", LP_OK);
        return 0;
    }
    size_t hold = held_back(r->text.buf, r->text.len, r->stop, r->spec.n_stop);
    size_t release = r->text.len - hold;
    if (release > 0) {
        bool go_on = r->spec.fn ? r->spec.fn(r->spec.user, id, r->text.buf, release) : true;
        memmove(r->text.buf, r->text.buf + release, hold);
        r->text.len = hold;
        if (!go_on) finish(e, r, "callback", LP_OK);
    }
    return 0;
}

/* The token a request takes from logits after n_hist tokens of history of
 * which n_gen are generated. *pruned: a CTG seed below its probability. */
static int32_t choose(const lp_engine *e, request *r, const float *logits, int n_hist, int n_gen, bool *pruned,
                      lp_token_logprobs *lp) {
    *pruned = false;
    if (lp) lp->token = -1;
    if (n_gen == 0 && r->spec.first_token >= 0) return r->spec.first_token;
    if (n_gen == 0 && r->spec.first_rank > 0) {
        float prob;
        int32_t tok = nth_best(logits, e->n_vocab, r->spec.first_rank - 1, &prob);
        *pruned = prob < r->spec.first_min_prob;
        return tok;
    }
    return lp_sampler_sample_ex(r->sampler, logits, r->tokens, n_hist, n_gen, r->spec.top_logprobs, lp);
}

/* The next token of a request from its last row's logits. */
static int take(lp_engine *e, request *r, int32_t tok, lp_error *err);
static int sample(lp_engine *e, request *r, const float *logits, lp_error *err) {
    bool pruned;
    lp_token_logprobs lp;
    int32_t tok = choose(e, r, logits, r->n_tokens, r->stats.n_generated, &pruned, r->spec.token_fn ? &lp : NULL);
    if (pruned) {
        finish(e, r, "pruned", LP_OK);
        return 0;
    }
    bool eog = r->spec.stop_at_eog && lp_token_is_eog(e->model, tok);
    if (r->spec.token_fn && lp.token == tok && !eog) r->spec.token_fn(r->spec.user, (int)(r - e->req), &lp);
    return take(e, r, tok, err);
}

/* Appends a chosen token: end of generation, text, stop strings, limits. */
static int take(lp_engine *e, request *r, int32_t tok, lp_error *err) {
    if (r->spec.stop_at_eog && lp_token_is_eog(e->model, tok)) {
        finish(e, r, "eog", LP_OK);
        return 0;
    }
    r->tokens[r->n_tokens++] = tok;
    r->stats.n_generated++;
    if (emit(e, r, tok, err)) return -1;
    if (r->state == REQ_DONE) return 0;
    if (r->stats.n_generated >= r->spec.max_tokens) finish(e, r, "length", LP_OK);
    else if (r->n_tokens > e->max_seq_len) finish(e, r, "context", LP_OK);
    return 0;
}

/* ---- steps ----------------------------------------------------------------------------------- */

/* Appends request id's next rows (from its n_kv, at most `room`) to the batch. */
static int add_rows(lp_engine *e, int id, int n, int room) {
    request *r = &e->req[id];
    int want = r->n_tokens - r->n_kv;
    if (want > room) want = room;
    for (int i = 0; i < want; i++) {
        int pos = r->n_kv + i;
        e->rows[n + i] = (lp_row){
            .token = r->tokens[pos],
            .pos = pos,
            .seq = r->seq,
            .adapter = pos < r->spec.n_prefix ? r->slot_prefix : r->slot,
            .parent = i > 0 ? n + i - 1 : -1,
            .logits = pos == r->n_tokens - 1,
            .commit = true,
        };
        e->row_req[n + i] = id;
    }
    return want;
}

/* ---- speculation: the tree of candidates, forecast rows, acceptance ------------------ */

/* The embedding table a request's forecast set is bound as, binding it to
 * one no other running request's set holds; 0 if none is free. */
static int table_for(lp_engine *e, request *r) {
    const lp_forecast *f = r->sp.forecast;
    if (!f || r->sp.depth == 0) return 0;
    int free_t = 0;
    for (int t = 1; t <= e->n_tables; t++) {
        if (e->table_of[t] == f) return t;
        if (free_t) continue;
        bool busy = false;
        for (int i = 0; e->table_of[t] && i < e->n_req && !busy; i++) {
            const request *o = &e->req[i];
            busy = o->used && o->state == REQ_RUNNING && o->speculating && o->sp.forecast == e->table_of[t];
        }
        if (!busy) free_t = t;
    }
    if (!free_t) return 0;
    if (bind_table(e, free_t, f) != 0) return 0;
    e->table_of[free_t] = f;
    return free_t;
}

/* Appends the forecast chain after row `after` (at most room rows). */
static int add_forecast_rows(lp_engine *e, request *r, int id, int n, int after, int m) {
    for (int j = 0; j < m; j++) {
        e->rows[n + j] = (lp_row){
            .token = j,
            .pos = e->rows[after].pos + 1 + j,
            .seq = r->seq,
            .adapter = r->slot,
            .parent = j == 0 ? after : n + j - 1,
            .embd = r->table,
            .logits = true,
        };
        e->row_req[n + j] = id;
    }
    return m;
}

/* After a request's last row (r->root_row) is in the batch: its candidate
 * tree and the forecast rows after the root and every candidate, as far as
 * rows, logit rows and the sequence's length allow. Candidates come parents
 * first, so any prefix of them is a tree. Returns the rows added. */
static int add_spec_rows(lp_engine *e, request *r, int n, int *n_logits) {
    int id = (int)(r - e->req), start = n, root = r->root_row;
    int root_pos = e->rows[root].pos;
    r->table = table_for(e, r);
    int m = r->table ? r->sp.depth : 0;
    for (int c = 0; c <= LP_SPEC_MAX_NODES; c++) r->fc_row[c] = -1;
    for (int c = 0; c < LP_SPEC_MAX_NODES; c++) r->cand_row[c] = -1;
    int rows_left = e->max_rows - n, logits_left = e->max_logit_rows - *n_logits;
    if (m > 0 && m <= rows_left && m <= logits_left && root_pos + m < e->max_seq_len) {
        r->fc_row[0] = n;
        n += add_forecast_rows(e, r, id, n, root, m);
        rows_left -= m;
        logits_left -= m;
    }
    for (int c = 0; c < r->n_cand; c++) {
        int pos = root_pos + r->cand_depth[c];
        int parent = r->cand_parent[c] < 0 ? root : r->cand_row[r->cand_parent[c]];
        if (parent < 0 || pos >= e->max_seq_len || rows_left < 1 || logits_left < 1) continue;
        r->cand_row[c] = n;
        e->rows[n] = (lp_row){
            .token = r->cand_tok[c], .pos = pos, .seq = r->seq, .adapter = r->slot,
            .parent = parent, .logits = true,
        };
        e->row_req[n++] = id;
        rows_left--;
        logits_left--;
        if (m > 0 && m <= rows_left && m <= logits_left && pos + m < e->max_seq_len) {
            r->fc_row[c + 1] = n;
            n += add_forecast_rows(e, r, id, n, n - 1, m);
            rows_left -= m;
            logits_left -= m;
        }
    }
    r->step_depth = m;
    *n_logits += n - start;
    return n - start;
}

/* The k best tokens of logits (ties: the lower id), best first. */
static int top_tokens(const float *logits, int n_vocab, int k, int32_t *out) {
    int have = 0;
    for (int32_t t = 0; t < n_vocab; t++) {
        if (have == k && logits[t] <= logits[out[k - 1]]) continue;
        int pos = have < k ? have++ : k - 1;
        while (pos > 0 && logits[out[pos - 1]] < logits[t]) {
            out[pos] = out[pos - 1];
            pos--;
        }
        out[pos] = t;
    }
    return have;
}

/* A child of candidate `parent` (-1: the root) with token tok, adding it
 * if there is none and room; -1 if neither. */
static int cand_child(request *r, int parent, int32_t tok, bool add) {
    for (int c = 0; c < r->n_cand; c++)
        if (r->cand_parent[c] == parent && r->cand_tok[c] == tok) return c;
    if (!add || r->n_cand >= r->sp.max_nodes) return -1;
    int c = r->n_cand++;
    r->cand_tok[c] = tok;
    r->cand_parent[c] = parent;
    r->cand_depth[c] = parent < 0 ? 1 : r->cand_depth[parent] + 1;
    return c;
}

static int spec_class(int depth, int rank) { return depth * SPEC_RANKS + (rank < SPEC_RANKS ? rank : SPEC_RANKS - 1); }
static int lookup_class(int chain, int pos) {
    return SPEC_LOOKUP_CLASS + chain * SPEC_LOOKUP_POSITIONS + (pos < SPEC_LOOKUP_POSITIONS ? pos : SPEC_LOOKUP_POSITIONS - 1);
}

/* cand_child that records a new candidate's class. */
static int add_candidate(request *r, int parent, int32_t tok, int cls) {
    int before = r->n_cand, c = cand_child(r, parent, tok, true);
    if (c >= 0 && c >= before) r->cand_class[c] = (uint8_t)cls;
    return c;
}

/* The relative cost of a pass of `rows` rows, straight on past the table. */
static double pass_cost(const lp_speculate *sp, int rows) {
    if (rows <= LP_SPEC_COST_ROWS) return sp->pass_cost[rows - 1];
    double last = sp->pass_cost[LP_SPEC_COST_ROWS - 1], slope = last - sp->pass_cost[LP_SPEC_COST_ROWS - 2];
    return last + slope * (rows - LP_SPEC_COST_ROWS);
}

/* Acceptance estimate of every class: its counts with a prior of weight 2
 * centred on the estimate of the class before it (the rank above, else the
 * depth above; the lookup position before), 1/2 for the first. So a class
 * never tried starts where its neighbour stands, which keeps the model
 * exploring deeper candidates once shallower ones are known to be good. */
static void class_estimates(const accept_table *t, double *est) {
    for (int d = 0; d < LP_SPEC_MAX_DEPTH; d++)
        for (int i = 0; i < SPEC_RANKS; i++) {
            int k = spec_class(d, i);
            double prior = i > 0 ? est[k - 1] : d > 0 ? est[spec_class(d - 1, 0)] : 0.5;
            est[k] = (t->hit[k] + 2.0 * prior) / (t->tried[k] + 2.0);
        }
    for (int c = 0; c < SPEC_LOOKUP_CHAINS; c++)
        for (int j = 0; j < SPEC_LOOKUP_POSITIONS; j++) {
            int k = lookup_class(c, j);
            double prior = j > 0 ? est[k - 1] : c > 0 ? est[lookup_class(c - 1, 0)] : 0.5;
            est[k] = (t->hit[k] + 2.0 * prior) / (t->tried[k] + 2.0);
        }
    for (int j = 0; j < SPEC_LOOKUP_POSITIONS; j++) {
        int k = SPEC_NGRAM_CLASS + j;
        double prior = j > 0 ? est[k - 1] : 0.5;
        est[k] = (t->hit[k] + 2.0 * prior) / (t->tried[k] + 2.0);
    }
}

/* The cost model: a candidate is accepted with its class's estimate
 * (class_estimates) times its parent's probability. Expected
 * tokens of a pass are 1 plus the sum over placed candidates; rows are the
 * root, the candidates and the forecast chains after each of them. Keeps
 * the most likely candidates (a prefix by probability is a tree: a child is
 * less likely than its parent) whose expected tokens per cost is highest,
 * and renumbers them parents first. */
static void keep_worthwhile(const lp_engine *e, request *r) {
    int n = r->n_cand, m = r->sp.forecast ? r->sp.depth : 0;
    double prob[LP_SPEC_MAX_NODES], est[SPEC_CLASSES];
    int order[LP_SPEC_MAX_NODES];
    class_estimates(&e->accept[r->accept], est);
    for (int c = 0; c < n; c++) {
        double p = est[r->cand_class[c]];
        prob[c] = p * (r->cand_parent[c] < 0 ? 1.0 : prob[r->cand_parent[c]]);
        int at = c; /* insertion by probability; ties keep the earlier (a parent) first */
        while (at > 0 && prob[order[at - 1]] < prob[c]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = c;
    }
    int best = 0;
    double expected = 1, best_value = 1.0 / pass_cost(&r->sp, 1 + m);
    for (int k = 1; k <= n; k++) {
        expected += prob[order[k - 1]];
        double value = expected / pass_cost(&r->sp, 1 + m + k * (1 + m));
        if (value > best_value) best_value = value, best = k;
    }
    /* Exploration: estimates that fell below the cost after a few misses
     * would never be tried again, so never recover. Every SPEC_EXPLORE-th
     * pass in a row without candidates places the likeliest one, if one
     * sure to be accepted would pay. */
    if (best > 0 || n == 0) r->pruned_passes = 0;
    else if (++r->pruned_passes >= SPEC_EXPLORE && 2.0 / pass_cost(&r->sp, 2 + 2 * m) > best_value)
        best = 1, r->pruned_passes = 0;
    bool keep[LP_SPEC_MAX_NODES] = {false};
    for (int k = 0; k < best; k++) keep[order[k]] = true;
    int renumber[LP_SPEC_MAX_NODES], kept = 0;
    for (int c = 0; c < n; c++) {
        renumber[c] = -1;
        if (!keep[c]) continue;
        renumber[c] = kept;
        r->cand_tok[kept] = r->cand_tok[c];
        r->cand_parent[kept] = r->cand_parent[c] < 0 ? -1 : renumber[r->cand_parent[c]];
        r->cand_depth[kept] = r->cand_depth[c];
        r->cand_class[kept] = r->cand_class[c];
        kept++;
    }
    r->n_cand = kept;
}

/* Acceptance counts after a pass: every placed candidate whose parent is on
 * the accepted path (or is the root) was tried; those on it were accepted. */
static void count_acceptance(lp_engine *e, const request *r, const int *path_cand, int a) {
    accept_table *t = &e->accept[r->accept];
    bool on_path[LP_SPEC_MAX_NODES] = {false};
    for (int j = 1; j <= a; j++) on_path[path_cand[j]] = true;
    for (int c = 0; c < r->n_cand; c++) {
        int p = r->cand_parent[c], k = r->cand_class[c];
        if (r->cand_row[c] < 0 || (p >= 0 && !on_path[p])) continue;
        if (t->tried[k] >= 1 << 12) t->tried[k] /= 2, t->hit[k] /= 2;
        t->tried[k]++;
        t->hit[k] += on_path[c];
    }
}

/* Adds chain number `chain` of prompt lookup: the history from `from` on. */
static void lookup_chain(request *r, int chain, int from) {
    int parent = -1;
    for (int i = from; i < r->n_tokens && i < from + r->sp.lookup_len; i++) {
        parent = add_candidate(r, parent, r->tokens[i], lookup_class(chain, i - from));
        if (parent < 0) break;
    }
}

/* A token's text without one leading space, in buf[BARE_MAX]; its length,
 * or -1 when longer. */
#define BARE_MAX 32
static int bare_piece(const lp_model *model, int32_t tok, char *buf) {
    size_t len = lp_token_to_piece(model, tok, buf, BARE_MAX);
    if (len > BARE_MAX) return -1;
    if (len > 0 && buf[0] == ' ') memmove(buf, buf + 1, --len);
    return (int)len;
}

/* When the last token occurs nowhere earlier, the chain after an earlier
 * token of the same text but for a leading space (the first one at or
 * after the anchor, else the latest): an output often starts with the word
 * its input has after a space ("fix: In the ..." -> "In the ..."), a
 * different BPE token. True if it placed a chain. */
static bool loose_lookup(const lp_engine *e, request *r) {
    const int32_t *t = r->tokens;
    int n = r->n_tokens, ahead = -1, latest = -1;
    for (int s = 0; s + 1 < n; s++)
        if (t[s] == t[n - 1]) return false;
    char last[BARE_MAX], other[BARE_MAX];
    int len = bare_piece(e->model, t[n - 1], last);
    if (len <= 0) return false;
    for (int s = 0; s + 1 < n; s++) {
        if (bare_piece(e->model, t[s], other) != len || memcmp(other, last, (size_t)len) != 0) continue;
        latest = s + 1;
        if (ahead < 0 && latest >= r->lookup_anchor) ahead = latest;
    }
    int from = ahead >= 0 ? ahead : latest;
    if (from < 0) return false;
    r->lookup_anchor = from;
    lookup_chain(r, 0, from);
    return true;
}

/* Prompt lookup: up to SPEC_LOOKUP_CHAINS chains, each what followed an
 * earlier occurrence in the history (prompt and output) of its last g
 * tokens, g from sp.lookup_ngram down to 1, the chains starting with
 * different tokens. Of a suffix's occurrences, the first at or after the
 * anchor (where the last first chain copied from) wins, else the latest:
 * a copying task's output walks forward through its input, and after a
 * changed word the word that follows occurs in several places. The second
 * chain is where a shorter suffix (or another occurrence) leads elsewhere,
 * e.g. past a doubled word that the output drops. */
static void lookup_candidates(const lp_engine *e, request *r) {
    const int32_t *t = r->tokens;
    int n = r->n_tokens, chains = 0;
    int32_t first[SPEC_LOOKUP_CHAINS];
    if (n >= 2 && loose_lookup(e, r)) return;
    for (int g = r->sp.lookup_ngram < n - 1 ? r->sp.lookup_ngram : n - 1; g >= 1 && chains < SPEC_LOOKUP_CHAINS; g--) {
        int ahead = -1, latest = -1; /* ends of occurrences (the token after them) */
        for (int s = 0; s + g < n; s++) {
            if (memcmp(t + s, t + n - g, (size_t)g * sizeof *t) != 0) continue;
            latest = s + g;
            if (ahead < 0 && latest >= r->lookup_anchor) ahead = latest;
        }
        int from[2] = {ahead, latest};
        for (int k = 0; k < 2 && chains < SPEC_LOOKUP_CHAINS; k++) {
            if (from[k] < 0) continue;
            bool seen = false;
            for (int c = 0; c < chains; c++) seen |= first[c] == t[from[k]];
            if (seen) continue;
            if (chains == 0) r->lookup_anchor = from[k];
            first[chains] = t[from[k]];
            lookup_chain(r, chains++, from[k]);
        }
    }
}

/* The chain the forecast set's corpus n-gram table drafts after the
 * history (lp_forecast_ngram_next), token by token. */
static void ngram_candidates(request *r) {
    const lp_forecast *f = r->sp.forecast;
    int len = r->sp.ngram_len == 0 ? 8 : r->sp.ngram_len;
    if (len <= 0 || !f || !lp_forecast_corpus_size(f)) return;
    int32_t h[3 + LP_SPEC_MAX_NODES];
    int n = r->n_tokens < 3 ? r->n_tokens : 3, parent = -1;
    memcpy(h, r->tokens + r->n_tokens - n, (size_t)n * sizeof *h);
    for (int j = 0; j < len; j++) {
        int32_t tok = lp_forecast_ngram_next(f, h, n);
        if (tok < 0) break;
        parent = add_candidate(r, parent, tok, SPEC_NGRAM_CLASS + (j < SPEC_LOOKUP_POSITIONS ? j : SPEC_LOOKUP_POSITIONS - 1));
        if (parent < 0) break;
        h[n++] = tok;
    }
}

/* The next candidate tree: the top tokens of the forecast rows after the
 * deepest accepted node (fc, or -1), as a tree of branches[d] per depth,
 * merged with a prompt-lookup chain. */
static void next_candidates(lp_engine *e, request *r, int fc) {
    r->n_cand = 0;
    if (fc >= 0) {
        int level_from = 0, level_to = 0; /* candidates of the previous depth; the root first */
        for (int d = 0; d < r->sp.depth; d++) {
            int32_t top[LP_SPEC_MAX_NODES];
            int k = r->sp.branches[d] < LP_SPEC_MAX_NODES ? r->sp.branches[d] : LP_SPEC_MAX_NODES;
            const float *lg = lp_logits(e->ctx, fc + d);
            if (!lg) break;
            k = top_tokens(lg, e->n_vocab, k, top);
            int first = r->n_cand;
            if (d == 0) {
                for (int i = 0; i < k; i++) add_candidate(r, -1, top[i], spec_class(d, i));
            } else {
                for (int p = level_from; p < level_to; p++)
                    for (int i = 0; i < k; i++) add_candidate(r, p, top[i], spec_class(d, i));
            }
            level_from = first;
            level_to = r->n_cand;
            if (level_to == level_from) break;
        }
    }
    if (r->sp.lookup_ngram > 0) lookup_candidates(e, r);
    ngram_candidates(r);
    if (r->sp.pass_cost[0] > 0) keep_worthwhile(e, r);
}

/* After a pass: the request's root row's logits give its next token, as in
 * plain decoding; while that token is a candidate placed in the tree, that
 * candidate's row (its KV computed over exactly the accepted path) is
 * committed and its logits give the token after. Tokens then go through the
 * same stops and limits as plain decoding; if one ends the request, its
 * sequence is cut back to what plain decoding would hold. */
static int spec_after(lp_engine *e, request *r, lp_error *err) {
    int root = r->root_row;
    r->root_row = -1;
    int n_hist = r->n_tokens, gen = r->stats.n_generated, remaining = r->spec.max_tokens - gen;
    int32_t toks[LP_SPEC_MAX_NODES + 1];
    int path_row[LP_SPEC_MAX_NODES + 1], path_cand[LP_SPEC_MAX_NODES + 1];
    int a = 0, cur_row = root, cur = -1;
    bool pruned = false;
    int placed = 0;
    for (int c = 0; c < r->n_cand; c++) placed += r->cand_row[c] >= 0;
    r->spec_stats.n_tree_rows += placed;
    for (int c = 0; c <= r->n_cand; c++)
        if (r->fc_row[c] >= 0) r->spec_stats.n_forecast_rows += r->step_depth;
    for (;;) {
        int32_t tok = choose(e, r, lp_logits(e->ctx, cur_row), n_hist + a, gen + a, &pruned, NULL);
        toks[a] = tok;
        if (pruned || (r->spec.stop_at_eog && lp_token_is_eog(e->model, tok))) break;
        if (a + 1 >= remaining || n_hist + a + 1 > e->max_seq_len) break;
        r->tokens[n_hist + a] = tok; /* history for the next choice (take writes it again) */
        int c = cand_child(r, cur, tok, false);
        if (c < 0 || r->cand_row[c] < 0) break;
        a++;
        path_row[a] = cur_row = r->cand_row[c];
        path_cand[a] = cur = c;
    }
    int seq = r->seq;
    if (a > 0 && lp_commit_rows(e->ctx, path_row + 1, a, NULL) != 0) {
        lp_seq_truncate(e->ctx, seq, r->n_kv, NULL); /* keep the root only */
        a = 0;
    }
    r->spec_stats.n_passes++;
    r->spec_stats.n_drafted += placed;
    count_acceptance(e, r, path_cand, a);
    int j = 0;
    for (; j <= a; j++) {
        if (j > 0) r->n_kv++;
        if (j == 0 && pruned) {
            finish(e, r, "pruned", LP_OK);
        } else {
            int before = r->stats.n_generated;
            if (take(e, r, toks[j], err)) return -1;
            r->spec_stats.n_generated += r->stats.n_generated - before;
            if (j > 0 && r->stats.n_generated > before) r->spec_stats.n_accepted++;
        }
        if (r->state == REQ_DONE) break;
    }
    if (r->state == REQ_DONE) {
        if (lp_seq_length(e->ctx, seq) > r->n_kv) lp_seq_truncate(e->ctx, seq, r->n_kv, NULL);
        return 0;
    }
    int fc = a == 0 ? r->fc_row[0] : r->fc_row[path_cand[a] + 1];
    next_candidates(e, r, fc);
    return 0;
}

/* Decode rows of running requests first (oldest first), then prompt rows in
 * admission order within the prefill budget. */
static int by_order(const void *a, const void *b) {
    int64_t x = ((const request *const *)a)[0]->order, y = ((const request *const *)b)[0]->order;
    return (x > y) - (x < y);
}

static int build_batch(lp_engine *e) {
    int n = 0, n_logits = 0, prefill = 0, n_run = 0;
    for (int i = 0; i < e->n_req; i++)
        if (e->req[i].used && e->req[i].state == REQ_RUNNING) {
            e->running[n_run++] = &e->req[i];
            e->req[i].root_row = -1;
        }
    qsort(e->running, (size_t)n_run, sizeof *e->running, by_order);
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < n_run; k++) {
            request *r = e->running[k];
            int id = (int)(r - e->req);
            bool decoding = r->n_kv == r->n_tokens - 1;
            if (decoding != (pass == 0) || n == e->max_rows) continue;
            int room = e->max_rows - n;
            if (!decoding) {
                int budget = e->params.max_prefill_rows - prefill;
                if (budget <= 0) continue;
                if (room > budget) room = budget;
            }
            /* a row with logits only if the logit rows allow it */
            if (r->n_tokens - r->n_kv <= room && n_logits == e->max_logit_rows) {
                if (decoding) continue;
                room = r->n_tokens - r->n_kv - 1;
                if (room <= 0) continue;
            }
            int added = add_rows(e, id, n, room);
            if (e->rows[n + added - 1].logits) {
                n_logits++;
                if (r->speculating) r->root_row = n + added - 1;
            }
            if (!decoding) prefill += added;
            n += added;
        }
    /* then the speculative requests' trees and forecast rows, in the room left */
    for (int k = 0; k < n_run; k++)
        if (e->running[k]->speculating && e->running[k]->root_row >= 0) n += add_spec_rows(e, e->running[k], n, &n_logits);
    return n;
}

/* After a pass: entries counted, tokens sampled from the logits rows. */
static int after_forward(lp_engine *e, int n, lp_error *err) {
    for (int i = 0; i < n; i++) {
        request *r = &e->req[e->row_req[i]];
        if (r->state != REQ_RUNNING || !e->rows[i].commit) continue; /* trees: spec_after */
        r->n_kv++;
        if (!e->rows[i].logits) continue;
        e->seqs[seq_index(e, r->seq)].used_at = ++e->clock;
        if (r->speculating && r->root_row == i) {
            if (spec_after(e, r, err)) return -1;
        } else if (sample(e, r, lp_logits(e->ctx, i), err)) {
            return -1;
        }
    }
    return 0;
}

static int not_done(const lp_engine *e) {
    int k = 0;
    for (int i = 0; i < e->n_req; i++) k += e->req[i].used && e->req[i].state != REQ_DONE;
    return k;
}

int lp_engine_step(lp_engine *e, lp_error *err) {
    for (;;) {
        admit_queued(e);
        int n = build_batch(e);
        if (n == 0) {
            int left = not_done(e);
            if (left == 0) return 0;
            /* queued requests but none running: the oldest cannot fit even
             * alone (waiting ones have a running leader) */
            request *oldest = NULL;
            bool held = false;
            for (int i = 0; i < e->n_req; i++) {
                request *r = &e->req[i];
                if (r->used && r->state == REQ_RUNNING) return lp_error_set(err, LP_ERR_INVALID, "engine stalled");
                if (r->used && r->state == REQ_QUEUED && (!oldest || r->submitted < oldest->submitted)) oldest = r;
                /* one preempted in this step waits only while others run */
                if (r->used && r->state == REQ_QUEUED && r->preempted_at) {
                    held = true;
                    r->preempted_at = 0;
                }
            }
            if (!held && !evict_one_cached(e, -1)) finish(e, oldest, "context", LP_ERR_KV_FULL);
            continue;
        }
        lp_error ferr = {0};
        if (lp_forward(e->ctx, e->rows, n, &ferr) == 0) {
            e->n_steps++;
            e->n_rows_total += n;
            if (after_forward(e, n, err)) return -1;
            return not_done(e);
        }
        if (ferr.status != LP_ERR_KV_FULL) {
            if (err) *err = ferr;
            return -1;
        }
        /* make room: idle cached prefixes first, then the youngest request */
        if (!evict_one_cached(e, -1) && !preempt_youngest(e)) {
            if (err) *err = ferr;
            return -1;
        }
    }
}

int lp_engine_run(lp_engine *e, lp_error *err) {
    int left;
    while ((left = lp_engine_step(e, err)) > 0) {
    }
    return left;
}

int lp_engine_cancel(lp_engine *e, int id, lp_error *err) {
    request *r = get(e, id);
    if (!r) return lp_error_set(err, LP_ERR_INVALID, "request %d does not exist", id);
    finish(e, r, "cancelled", LP_ERR_CANCELLED);
    return 0;
}

int lp_engine_request_stats(const lp_engine *e, int id, lp_request_stats *stats) {
    const request *r = get(e, id);
    if (!r) return -1;
    *stats = r->stats;
    return 0;
}

const int32_t *lp_engine_request_tokens(const lp_engine *e, int id, int *n) {
    const request *r = get(e, id);
    if (!r) {
        if (n) *n = 0;
        return NULL;
    }
    if (n) *n = r->stats.n_generated;
    return r->tokens + r->stats.n_prompt;
}

void lp_engine_release(lp_engine *e, int id) {
    request *r = get(e, id);
    if (!r) return;
    if (r->state != REQ_DONE) finish(e, r, "cancelled", LP_ERR_CANCELLED);
    request_clear(r);
}

int lp_engine_request_spec_stats(const lp_engine *e, int id, lp_spec_stats *stats) {
    const request *r = get(e, id);
    if (!r || !stats) return -1;
    *stats = r->spec_stats;
    return 0;
}

void lp_engine_counts(const lp_engine *e, int64_t *steps, int64_t *rows) {
    if (steps) *steps = e->n_steps;
    if (rows) *rows = e->n_rows_total;
}
