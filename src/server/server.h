/* `loraplex serve`: an OpenAI-compatible HTTP server over the engine.
 *
 * libmicrohttpd runs one thread per connection; those threads parse and
 * tokenize requests and wait, while ONE scheduler thread owns the context
 * and the engine and steps it: every step is one batch of prefill chunks and
 * decode rows of all active requests, each with its own adapter. Text flows
 * back through per-request buffers under one mutex. */
#ifndef LP_SERVER_H
#define LP_SERVER_H

#include <stdbool.h>

#include "loraplex.h"

#define LP_SERVER_MAX_ADAPTERS 64

typedef struct lp_server_params {
    const char *model;                /* the base */
    const char *adapter_names[LP_SERVER_MAX_ADAPTERS];
    const char *adapter_paths[LP_SERVER_MAX_ADAPTERS];
    int n_adapters;
    const char *host;                 /* "127.0.0.1" */
    int port;                         /* 8080; 0: any free port (printed) */
    const char *api_key;              /* NULL: none */
    int parallel;                     /* requests decoded together (16) */
    int max_queue;                    /* waiting requests before 503 (64) */
    int n_ctx;                        /* KV tokens for all requests (0: 4096 per 4 requests) */
    int n_threads;                    /* 0: all cores */
    int max_tokens;                   /* default and cap of max_tokens (1024) */
    size_t max_body;                  /* request body limit in bytes (8 MiB) */
    int timeout_s;                    /* idle connection timeout (600) */
    bool quiet;                       /* no per-request log lines */
    const char *adapter_dir;          /* POST /v1/load_lora_adapter loads only from
                                         here (NULL: hot loading is off) */
    int max_lora_rank;                /* highest rank a hot-loaded adapter may have
                                         (0: the startup adapters', at least 64) */
    /* speculative decoding (docs/speculate.md, docs/server.md) */
    const char *forecast_names[LP_SERVER_MAX_ADAPTERS]; /* adapter name (or the base's) */
    const char *forecast_paths[LP_SERVER_MAX_ADAPTERS]; /* its .lpf file */
    int n_forecasts;
    int speculate;                    /* the default of requests: LP_SERVER_SPEC_* */
    int lookup_ngram, lookup_len;     /* prompt lookup (3, 8) */
    int tree[LP_SPEC_MAX_DEPTH];      /* candidates per forecast depth ({3, 2}) */
    int tree_depth;
} lp_server_params;

/* --speculate, the default of requests: off (a request may still ask with
 * "speculate": true, which then uses the adapter's forecast set and lookup),
 * lookup (prompt lookup only), on (the adapter's forecast set when one is
 * bound, plus lookup, every candidate placed), auto (as on, with the cost
 * model measured at startup pruning candidates that do not pay). */
enum { LP_SERVER_SPEC_OFF, LP_SERVER_SPEC_LOOKUP, LP_SERVER_SPEC_ON, LP_SERVER_SPEC_AUTO };

lp_server_params lp_server_default_params(void);

/* Loads the model and adapters, serves until SIGINT or SIGTERM, shuts down
 * cleanly (running requests are cancelled and their streams ended). Returns
 * 0, or -1 with err set when it cannot start. */
int lp_server_run(const lp_server_params *params, lp_error *err);

#endif
