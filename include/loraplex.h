/* loraplex: one frozen Llama-family model, many adapters, on a CPU.
 *
 * The whole public C API. Opaque handles, explicit errors (every fallible
 * call takes an lp_error * and returns NULL / a negative value on failure
 * with a status and a human-readable message in it), no global state.
 *
 * Threading: a model is immutable after loading and may be shared by any
 * number of contexts in any threads; a context (and an engine over it) is
 * used by one thread at a time (it owns its worker threads).
 *
 * Lifetimes and ownership:
 *   - a model outlives every context and adapter made from it, and an
 *     adapter outlives every slot binding it (and every engine request
 *     naming it); free them in the reverse order;
 *   - strings in lp_model_info, and lp_adapter_name, live as long as the
 *     model / adapter; logits (lp_logits) until the next lp_forward on that
 *     context; engine token arrays until the engine next steps;
 *   - memory a call returns for the caller to keep (lp_chat_apply) is
 *     released with lp_free; every other pointer stays the library's.
 *
 * The model of computation (README, "The C API"; docs/engine.md):
 *   - a context owns a paged KV cache holding up to max_sequences sequences;
 *   - lp_forward runs ONE batch of rows through the model. A row is a token
 *     (or a row of a bound embedding table) at a position in a sequence. It
 *     sees its sequence's committed KV plus its chain of parent rows in the
 *     same batch (parent = -1: none). Prefill is a chain of rows, decode is
 *     one row per sequence, a speculative tree is a tree of rows;
 *   - rows flagged `commit` are appended to their sequence's KV after the
 *     pass; others can be committed later with lp_commit_rows (until the
 *     next forward);
 *   - the engine (lp_engine) builds those batches from many requests. */
#ifndef LORAPLEX_H
#define LORAPLEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LORAPLEX_VERSION "0.1.0"

/* What kind of failure an lp_error holds, so a caller (a scheduler, a
 * server) can tell a full KV cache or a cancellation from a bad file or a
 * bug in its own use of the API. */
typedef enum lp_status {
    LP_OK = 0,
    LP_ERR_INVALID,    /* an argument or call the API rejects (misuse) */
    LP_ERR_NOMEM,      /* out of memory */
    LP_ERR_KV_FULL,    /* the KV cache (or a sequence's length limit) has no room */
    LP_ERR_CANCELLED,  /* stopped by the caller's abort hook or a cancel */
    LP_ERR_IO,         /* a file could not be opened, read, mapped or written */
    LP_ERR_FORMAT,     /* a file's content is malformed or does not fit the model */
} lp_status;

typedef struct lp_error {
    lp_status status;   /* LP_OK until a call fails */
    char message[512];  /* human-readable: names the file or argument and the problem */
} lp_error;

/* "ok", "invalid argument", "out of memory", "KV cache full", "cancelled",
 * "I/O error", "format error". */
const char *lp_status_name(lp_status status);
/* Fills err (if non-NULL) with a status and a printf-style message and
 * returns -1, for code built on this API that reports errors the same way
 * (the engine does). */
int lp_error_set(lp_error *err, lp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Releases memory the library handed to the caller (NULL is fine). */
void lp_free(void *p);

typedef struct lp_model lp_model;
typedef struct lp_context lp_context;
typedef struct lp_sampler lp_sampler;
typedef struct lp_adapter lp_adapter;
typedef struct lp_forecast lp_forecast; /* speculative decoding, below */

/* ---- models ------------------------------------------------------------- */

typedef struct lp_model_params {
    /* llama2.c checkpoints keep the vocabulary in a separate file; NULL
     * looks for tokenizer.bin next to the checkpoint. Ignored otherwise. */
    const char *tokenizer_path;
    /* GGUF Q4_0 / Q8_0 matrices are repacked losslessly at load into the
     * integer kernels' layout (W4 / W8, group 32); other block types
     * (K-quants, Q4_1, Q5_0, Q5_1) are requantized to W8 group 32, each
     * weight within half an 8-bit step (its group's largest |w| / 254) of
     * the stored value (an untied token embedding, read only row by row,
     * keeps its type). true keeps every matrix as stored (float kernels on
     * the exact values; for comparisons). */
    bool no_repack;
    /* Activations of the integer kernels: 0 = the model's choice (.lpx files
     * record it; int8 otherwise), 8 = int8 (W4A8 / W8A8), 32 = float
     * (W4A16 / W8A16, for accuracy comparison). */
    int activations;
    /* Threads that convert GGUF block matrices at load (0: all cores; 1:
     * the loading thread alone). */
    int n_load_threads;
    /* false (default): a compiled .lpx file is used in place from its
     * memory map (no copy; pages shared with the page cache and other
     * processes). true: it is read into memory asked to be backed by 2 MiB
     * pages (Linux transparent huge pages, where enabled): decode streams
     * every weight once per step, and 2 MiB pages take the TLB misses and
     * the prefetch stops at 4 KiB page edges out of that stream, at the
     * cost of a copy at load and memory the page cache does not share
     * (docs/benchmarks.md section 14: a few percent on Zen 5). */
    bool huge_pages;
} lp_model_params;

/* Loads a compiled .lpx file (memory-mapped, used in place; or read into
 * huge pages, see huge_pages), a GGUF file, a
 * Hugging Face model directory (config.json + safetensors + tokenizer.json)
 * or a llama2.c checkpoint (.bin). params may be NULL. */
lp_model *lp_model_load(const char *path, const lp_model_params *params,
                        lp_error *err);
void lp_model_free(lp_model *model);

typedef struct lp_model_info {
    const char *arch;         /* "llama", "qwen2", "qwen3" */
    const char *format;       /* "lpx", "gguf", "safetensors", "llama2c" */
    const char *name;         /* general.name or "" */
    int n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim;
    int n_ctx_train;
    float rope_theta, rms_eps;
    bool rope_neox, rope_freq_factors, tied_output;
    uint64_t n_params;
    uint64_t weight_bytes;    /* bytes of all weights as stored */
    const char *tokenizer;    /* "spm" or "bpe" */
    const char *chat_format;  /* "llama3", "chatml", "llama2", "mistral", "none" */
} lp_model_info;

void lp_model_get_info(const lp_model *model, lp_model_info *info);
/* Type name of a named tensor kind for info output: "F16", "Q4_0", ...
 * Calls fn once per weight matrix (name, type, rows, cols). */
void lp_model_foreach_weight(const lp_model *model,
                             void (*fn)(void *user, const char *name,
                                        const char *type, int64_t rows,
                                        int64_t cols),
                             void *user);

/* ---- tokens ------------------------------------------------------------- */

/* Returns the token count (may exceed cap: then only cap are written), or -1. */
int lp_tokenize(const lp_model *model, const char *text, size_t len,
                bool add_bos, bool parse_special, int32_t *out, int cap,
                lp_error *err);
/* Bytes of one token's text (may be partial UTF-8). Returns the length needed. */
size_t lp_token_to_piece(const lp_model *model, int32_t token, char *buf,
                         size_t cap);
int32_t lp_token_bos(const lp_model *model);
int32_t lp_token_eos(const lp_model *model);
bool lp_token_is_eog(const lp_model *model, int32_t token);
bool lp_model_add_bos(const lp_model *model);

typedef struct lp_message {
    const char *role;
    const char *content;
} lp_message;

/* Renders a chat with the model's template; the string is the caller's
 * (lp_free). */
char *lp_chat_apply(const lp_model *model, const lp_message *msgs, int n,
                    bool add_generation_prompt, lp_error *err);

/* ---- contexts and the batched forward ------------------------------------ */

typedef struct lp_context_params {
    int n_threads;        /* 0: all cores */
    int max_rows;         /* rows per forward (default 512) */
    int max_sequences;    /* default 16 */
    int max_logit_rows;   /* rows per forward that may ask for logits (default 64) */
    int n_ctx;            /* KV capacity in tokens over all sequences
                             (default: min(model's, 4096) * 1) */
    int max_seq_len;      /* longest one sequence may get (default n_ctx) */
    int max_adapters;     /* adapter slots besides slot 0 = base (default 8) */
    int max_adapter_rank; /* highest LoRA rank a bound adapter may have (default 256) */
    int max_embd_tables;  /* embedding tables that may be bound (default 4) */
    bool kv_f32;          /* keep the KV cache in f32. Default f16: half the memory
                             and half the bytes attention reads; keys and values
                             are rounded to f16 when made, so a row's result never
                             depends on whether it reads them from the cache or
                             from its own batch */
} lp_context_params;

lp_context_params lp_context_default_params(void);
lp_context *lp_context_create(const lp_model *model,
                              const lp_context_params *params, lp_error *err);
void lp_context_free(lp_context *ctx);
const lp_model *lp_context_model(const lp_context *ctx);
/* The parameters the context was planned with, defaults filled in. */
void lp_context_get_params(const lp_context *ctx, lp_context_params *params);

/* One row of a batch. Build rows with designated initialisers, e.g.
 *   (lp_row){.token = t, .pos = p, .seq = s, .parent = -1, .logits = true, .commit = true}
 * (fields left out are 0: the base adapter, a token input). */
typedef struct lp_row {
    int32_t token;        /* the input token; with embd > 0, the row of that
                             embedding table to feed instead */
    int32_t pos;          /* rope position (usually the sequence's length plus
                             the row's depth in its parent chain) */
    int32_t seq;          /* sequence id, 0..max_sequences-1 */
    int32_t adapter;      /* adapter slot, 0 = base only */
    int32_t parent;       /* index of an earlier row of the same sequence in
                             this batch that this row may see, with its own
                             parents; -1 = only committed KV. Note that 0 is
                             row 0, so rows without a parent must say -1 */
    int32_t embd;         /* 0: the input is token's embedding; k > 0: row
                             `token` of the embedding table bound as k
                             (lp_context_bind_embeddings), e.g. DS2D's learned
                             forecast embeddings */
    bool logits;          /* compute logits for this row */
    bool commit;          /* append this row's KV to its sequence */
} lp_row;

/* Runs the batch. Never allocates. Rejected before any work (LP_ERR_INVALID):
 * a token outside the vocabulary, a sequence, adapter slot or embedding
 * table that does not exist or is not bound, a parent that is not an
 * earlier row of the same sequence, more rows or logit rows than the
 * context was planned for. LP_ERR_KV_FULL: the committed rows do not fit
 * the KV cache or a sequence's length limit (nothing was changed). With an
 * abort hook that fires, LP_ERR_CANCELLED and nothing is committed. */
int lp_forward(lp_context *ctx, const lp_row *rows, int n_rows, lp_error *err);
/* Logits (n_vocab floats) of row i of the last forward, NULL if that row
 * did not ask for logits. Valid until the next lp_forward. */
const float *lp_logits(const lp_context *ctx, int row);
/* Commits rows of the last forward (in the order given) to their sequences:
 * the path a speculative tree accepted. A row may be committed once. */
int lp_commit_rows(lp_context *ctx, const int *rows, int n, lp_error *err);
/* A hook lp_forward calls between layers; returning true abandons the pass
 * (LP_ERR_CANCELLED, nothing committed), so a long prefill can be
 * interrupted. fn NULL removes it. */
void lp_context_set_abort(lp_context *ctx, bool (*fn)(void *user), void *user);

/* Binds an embedding table (n_rows x dim floats, row-major; it must outlive
 * the binding) as table k (1..max_embd_tables): rows with embd = k feed
 * row `token` of it instead of a token embedding. data NULL unbinds. */
int lp_context_bind_embeddings(lp_context *ctx, int k, const float *data, int n_rows,
                               lp_error *err);
/* A KV prefix for the rows of embedding table k: in every layer they also
 * attend to n extra entries no other row sees (DS2D's forecast prefix).
 * kv: [n_layers][2][n][n_kv_heads * head_dim] floats, each layer's keys
 * (roped at positions 0..n-1) then its values; it must outlive the binding;
 * n 0..LP_MAX_KV_PREFIX (0 or kv NULL: none). Unbinding the table keeps it. */
#define LP_MAX_KV_PREFIX 64
int lp_context_bind_kv_prefix(lp_context *ctx, int k, const float *kv, int n, lp_error *err);

/* Sequences: ids 0..max_sequences-1. */
int lp_seq_length(const lp_context *ctx, int seq);
/* Drops a sequence's KV (frees its blocks unless shared). */
void lp_seq_clear(lp_context *ctx, int seq);
/* Keeps the first n entries. */
int lp_seq_truncate(lp_context *ctx, int seq, int n, lp_error *err);
/* dst becomes a copy of src sharing all KV blocks (no data copied). */
int lp_seq_fork(lp_context *ctx, int src, int dst, lp_error *err);
/* Entry pos of a committed sequence: its token (-1 for an embedding-table
 * input) and the identity of the adapter it was computed with (0 = base;
 * lp_adapter_identity). Returns 0, or -1 if there is no such entry. The
 * engine's prefix cache matches prompts against these. */
int lp_seq_entry(const lp_context *ctx, int seq, int pos, int32_t *token,
                 uint64_t *adapter_identity);
/* KV blocks in use / total (for tests and memory reports). */
void lp_kv_usage(const lp_context *ctx, int *blocks_used, int *blocks_total,
                 int *block_tokens);
/* Bytes of one KV block: keys and values of block_tokens entries in every
 * layer (f16 or f32, as the context keeps them). */
size_t lp_kv_block_bytes(const lp_context *ctx);

/* ---- adapters ----------------------------------------------------------------- */

/* Loads a LoRA adapter for `model`: a native .lpa file, a Hugging Face PEFT
 * directory (adapter_config.json + adapter_model.safetensors) or a llama.cpp
 * GGUF LoRA. It is validated against the model (architecture, every shape,
 * and for .lpa files the base's fingerprint) and converted to the model's
 * conventions. `scale` multiplies the adapter's own alpha/r scaling (1 =
 * as trained). Unsupported features (DoRA, modules_to_save, embedding or
 * lm_head adapters) are rejected with a message saying what and where. */
lp_adapter *lp_adapter_load(const lp_model *model, const char *path, float scale,
                            lp_error *err);
void lp_adapter_free(lp_adapter *adapter);
const char *lp_adapter_name(const lp_adapter *adapter);
uint64_t lp_adapter_bytes(const lp_adapter *adapter);
/* The largest rank of its pairs (contexts take adapters up to their
 * max_adapter_rank). */
int lp_adapter_max_rank(const lp_adapter *adapter);
/* A hash of everything that shapes the adapter's output: every weight byte,
 * shape and scale (the load-time scale included). Never 0; KV made with one
 * adapter is only reused for an adapter with the same identity. */
uint64_t lp_adapter_identity(const lp_adapter *adapter);

/* Binds an adapter to a slot (1..max_adapters) of a context; rows whose
 * `adapter` field is that slot get its correction. Rebinding a slot is just
 * a pointer store: no allocation, no reload. adapter NULL unbinds. The
 * adapter must outlive the binding. */
int lp_context_bind_adapter(lp_context *ctx, int slot, const lp_adapter *adapter,
                            lp_error *err);
/* The adapter bound to a slot (NULL: none; slot 0 is always the base). */
const lp_adapter *lp_context_slot_adapter(const lp_context *ctx, int slot);
/* Binds a forecast set (speculative decoding, below) to a slot (0 = the
 * base, 1..max_adapters): lp_generate and lp_generate_streams speculate
 * with the set bound to each stream's slot, so switching a stream's task
 * switches both without a reload. The set must fit the model
 * (lp_forecast_check); one trained for another adapter is allowed (the
 * output is the same, only acceptance drops). Binding another adapter to
 * the slot unbinds it; NULL unbinds. The set must outlive the binding. */
int lp_context_bind_forecast(lp_context *ctx, int slot, const lp_forecast *forecast,
                             lp_error *err);
/* The forecast set bound to a slot (NULL: none). */
const lp_forecast *lp_context_slot_forecast(const lp_context *ctx, int slot);

/* ---- shared quantization profiles (QUAD, docs/quad.md) ------------------------ */

/* One set of quantization encodings for every adapter of a base (.lpq,
 * `loraplex quad profile`): adapters quantized under it (`loraplex quad fit`)
 * store integer codes only and run with static activation encodings. */
typedef struct lp_profile lp_profile;
lp_profile *lp_profile_load(const lp_model *model, const char *path, lp_error *err);
void lp_profile_free(lp_profile *profile);
uint64_t lp_profile_id(const lp_profile *profile);
/* Weight bits of its codes (8 or 4). */
int lp_profile_bits(const lp_profile *profile);
/* Binds the profile to the context, once (the profile must outlive it);
 * afterwards lp_context_bind_adapter takes adapters quantized under it (and
 * plain ones). An adapter under another profile, or under one while none is
 * bound, is refused with a message naming both ids. */
int lp_context_bind_profile(lp_context *ctx, const lp_profile *profile, lp_error *err);
/* 0 if the adapter can run under the profile (NULL: none bound). */
int lp_profile_check_adapter(const lp_profile *profile, const lp_adapter *adapter, lp_error *err);
/* Slots besides the base (max_adapters). */
int lp_context_n_slots(const lp_context *ctx);

/* ---- sampling ------------------------------------------------------------- */

typedef struct lp_sampler_params {
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off */
    int repeat_last_n;    /* tokens of history the penalty looks at */
    uint64_t seed;
    /* OpenAI's penalties over the generated tokens (0 = off): a token's
     * logit loses presence_penalty if it was generated at all and
     * frequency_penalty times the number of times it was */
    float presence_penalty, frequency_penalty;
    const struct lp_logit_bias *logit_bias; /* added to the logits (copied by
                                 lp_sampler_create; ids outside the vocabulary
                                 are refused) */
    int n_logit_bias;
} lp_sampler_params;

typedef struct lp_logit_bias {
    int32_t token;
    float bias;
} lp_logit_bias;

#define LP_MAX_TOP_LOGPROBS 20

/* Log-probabilities of one sampled token: of the distribution after the
 * penalties and the logit bias, before temperature and top-k / top-p /
 * min-p truncation (what OpenAI's logprobs report). */
typedef struct lp_token_logprobs {
    int32_t token;
    float logprob;
    int n_top;                /* the best n_top tokens, most likely first */
    int32_t top_token[LP_MAX_TOP_LOGPROBS];
    float top_logprob[LP_MAX_TOP_LOGPROBS];
} lp_token_logprobs;

lp_sampler_params lp_sampler_default_params(void);
lp_sampler *lp_sampler_create(const lp_model *model,
                              const lp_sampler_params *params, lp_error *err);
void lp_sampler_free(lp_sampler *s);
void lp_sampler_reset(lp_sampler *s, uint64_t seed);
/* Its settings (seed: the one it was created or last reset with). */
lp_sampler_params lp_sampler_get_params(const lp_sampler *s);
/* Picks a token from logits (not modified); history: tokens so far. */
int32_t lp_sampler_sample(lp_sampler *s, const float *logits,
                          const int32_t *history, int n_history);
/* The same, where the last n_generated entries of history are the
 * generated tokens (the presence and frequency penalties count only those;
 * lp_sampler_sample counts the whole history), and lp (NULL: not computed)
 * gets the chosen token's log-probability and the n_top best
 * (0..LP_MAX_TOP_LOGPROBS) from the same logits the draw sees. */
int32_t lp_sampler_sample_ex(lp_sampler *s, const float *logits, const int32_t *history,
                             int n_history, int n_generated, int n_top,
                             lp_token_logprobs *lp);

/* ---- generation ------------------------------------------------------------ */

/* Text of one stream as it is produced; return false to stop that stream. */
typedef bool (*lp_stream_fn)(void *user, int stream, const char *text, size_t len);

/* One of N variants decoded together from a shared prompt. */
typedef struct lp_stream {
    const char *suffix;       /* text appended after the shared prompt for this
                                 stream only (e.g. an instruction), or NULL */
    int adapter;              /* adapter slot this stream decodes with (0 = base) */
    lp_sampler *sampler;      /* this stream's sampler: settings and seed */
    int32_t first_token;      /* force the first generated token (-1 = sample) */
} lp_stream;

/* Speculation counters of one request or stream (lp_engine_request_spec_stats,
 * lp_stream_stats; zeros for plain decoding). */
typedef struct lp_spec_stats {
    int n_passes;      /* forwards that produced at least one of its tokens */
    int n_generated;   /* tokens it generated (= lp_request_stats.n_generated) */
    int n_drafted;     /* candidate tokens verified (tree nodes) */
    int n_accepted;    /* of them accepted (tokens beyond one per pass) */
    int n_forecast_rows, n_tree_rows; /* rows it added for them */
} lp_spec_stats;

typedef struct lp_generate_params {
    int n_predict;              /* max new tokens per stream (default 128) */
    const char *const *stop;    /* stop strings, n_stop of them */
    int n_stop;
    bool stop_at_eog;           /* default true */
    int first_seq;              /* streams use sequences first_seq.. (default 0) */
    int prefix_adapter;         /* slot the shared prompt is computed with (default 0) */
    bool reuse_cache;           /* keep KV of a matching earlier prefix in the first
                                   sequence (same tokens, same adapter; default true) */
    int seed_top;               /* > 0: stream i starts from the i-th most likely
                                   distinct first token (the CTG paper's mechanism) */
    float seed_top_min_prob;    /* with seed_top: streams whose seed token is less
                                   likely than this end at once ("pruned") */
    const struct lp_speculate *speculate; /* NULL: one token per step. Else every
                                   stream decodes speculatively with these settings
                                   (the output is the plain output) and, where they
                                   name no forecast set, with the one bound to its
                                   slot (lp_context_bind_forecast; depth cut to its k,
                                   0 where none is bound). Streams' samplers must
                                   then be distinct, or greedy */
} lp_generate_params;

typedef struct lp_stream_stats {
    int n_generated;
    const char *stop_reason;    /* "eog", "stop", "length", "callback", "context", "pruned" */
    lp_spec_stats spec;         /* its speculation (lp_generate_params.speculate) */
} lp_stream_stats;

typedef struct lp_generate_stats {
    int n_prompt, n_reused;     /* prompt tokens; of them taken from the cache */
    int n_generated;            /* over all streams */
    double prefill_seconds, decode_seconds;
    int decode_steps;           /* forwards after every stream had its first token */
    int steps;                  /* forwards in all */
    const char *stop_reason;    /* of stream 0 */
    lp_spec_stats spec;         /* summed over the streams */
} lp_generate_stats;

lp_generate_params lp_generate_default_params(void);

/* Decodes n_streams variants of one prompt together: the prompt is computed
 * once (its KV blocks shared by every stream, never copied), each stream's
 * own rows (last prompt token with its adapter, its suffix, its tokens) go
 * through one batched forward per step, and each stream ends on its own
 * (EOS, stop string, length), freeing its own KV. Every stream's output is
 * identical to running it alone. Needs first_seq + n_streams <= max_sequences.
 * stream_stats (n_streams entries) may be NULL. */
int lp_generate_streams(lp_context *ctx, const int32_t *prompt, int n_prompt,
                        const lp_stream *streams, int n_streams,
                        const lp_generate_params *params, lp_stream_fn fn, void *user,
                        lp_stream_stats *stream_stats, lp_generate_stats *stats,
                        lp_error *err);

/* One stream: prefill the prompt (in batches of max_rows), then decode,
 * streaming text (stop strings are held back until resolved). */
typedef bool (*lp_text_fn)(void *user, const char *text, size_t len);
int lp_generate(lp_context *ctx, lp_sampler *sampler, const int32_t *prompt,
                int n_prompt, const lp_generate_params *params, lp_text_fn fn,
                void *user, lp_generate_stats *stats, lp_error *err);

/* ---- the engine: many requests, one batch per step ------------------------- */

/* A step-wise scheduler over one context, built on the API above: it holds
 * requests (prompt, adapter, sampler, stops, limits, a text callback) and
 * each lp_engine_step builds ONE batch from all of them — decode rows of
 * running requests first, then prefill chunks of new ones (at most
 * max_prefill_rows a step, so decode latency stays low) — runs one
 * lp_forward, samples, streams text and retires finished requests.
 *
 * Sequences are the engine's: it takes them from the range it was given,
 * and binds request adapters to the context's slots as it needs them (a
 * slot already bound to a request's adapter is used as it is). A finished
 * request's KV stays as a prefix cache: a later request whose prompt
 * starts with the same tokens computed with the same adapter identity
 * starts from it instead of recomputing; requests admitted together that
 * share a prefix compute it once (the later ones wait for it and fork its
 * blocks). When the KV cache is full the engine first evicts idle cached
 * prefixes (least recently used first), then preempts the youngest running
 * request: its KV is dropped and it is requeued to recompute its prompt and
 * the tokens it already generated, so its output is unchanged; a request
 * that cannot fit even alone ends with status LP_ERR_KV_FULL and stop
 * reason "context". The engine, like its context, is used by one thread. */
typedef struct lp_engine lp_engine;

/* Text of a request as it is produced (stop strings held back until
 * resolved); return false to end the request ("callback"). */
typedef bool (*lp_request_fn)(void *user, int request, const char *text, size_t len);
/* Each generated token with its log-probabilities (lp_request.token_fn),
 * called before its text goes to lp_request_fn; an end-of-generation token
 * that ends the request is not reported. */
typedef void (*lp_token_fn)(void *user, int request, const lp_token_logprobs *lp);

typedef struct lp_request {
    const int32_t *prompt;      /* prompt tokens (copied at submit), or NULL and ... */
    int n_prompt;
    const char *text;           /* ... the prompt as text (BOS as the model wants,
                                   special tokens parsed) */
    const lp_adapter *adapter;  /* NULL: the base */
    const lp_adapter *prefix_adapter; /* the first n_prefix prompt tokens are computed
                                   with this adapter instead (NULL: the base) — a
                                   shared prompt under one adapter, continued
                                   under another (CTG streams) */
    int n_prefix;
    lp_sampler *sampler;        /* borrowed; NULL: the engine makes one from sampling */
    lp_sampler_params sampling;
    int max_tokens;             /* tokens to generate at most (0: none) */
    const char *const *stop;    /* stop strings (copied), n_stop of them */
    int n_stop;
    bool stop_at_eog;
    int32_t first_token;        /* force the first generated token (-1: sample) */
    int first_rank;             /* > 0: the first token is the first_rank-th most
                                   likely one (1 = the best; CTG seeding) ... */
    float first_min_prob;       /* ... and the request ends at once ("pruned") if
                                   that token is less likely than this */
    bool no_reuse;              /* compute the whole prompt (no prefix cache) */
    bool drop_kv;               /* free the KV when done instead of caching it */
    lp_request_fn fn;
    void *user;
    lp_token_fn token_fn;       /* NULL: no log-probabilities; else sampled tokens
                                   (not forced or speculated ones) are reported
                                   with the top_logprobs best alternatives */
    int top_logprobs;           /* 0..LP_MAX_TOP_LOGPROBS */
    const struct lp_speculate *speculate; /* NULL: one token per step; else
                                   speculative decoding (below; copied at submit) */
} lp_request;

/* max_tokens 128, stop_at_eog, first_token -1, sampling defaults. */
lp_request lp_request_default(void);

typedef struct lp_request_stats {
    bool done;
    lp_status status;           /* LP_OK; LP_ERR_KV_FULL; LP_ERR_CANCELLED; LP_ERR_INVALID */
    const char *stop_reason;    /* "eog", "stop", "length", "callback", "context",
                                   "pruned", "cancelled", "error" (an adapter the
                                   context cannot take); NULL while running */
    int n_prompt, n_reused;     /* prompt tokens; of them taken from cached KV */
    int n_generated;
    int n_preempted;            /* times its KV was dropped to make room */
    int seq;                    /* its sequence while it runs or caches (-1: none) */
} lp_request_stats;

typedef struct lp_engine_params {
    int max_prefill_rows;       /* prompt rows per step over all requests
                                   (default: the context's max_rows) */
    int first_seq, n_seqs;      /* the sequences it may use (default all) */
    int min_shared;             /* a new request waits for a running one to compute
                                   a common prefix only if it is at least this many
                                   tokens longer than what it can reuse now (0: 16;
                                   the streams use 1) */
} lp_engine_params;

lp_engine_params lp_engine_default_params(void);
/* The context's sequences in the range that hold KV become cached prefixes. */
lp_engine *lp_engine_create(lp_context *ctx, const lp_engine_params *params,
                            lp_error *err);
/* Frees the engine and its requests; KV of unfinished requests is freed,
 * cached prefixes stay in the context for a later engine. */
void lp_engine_free(lp_engine *engine);
/* Queues a request; returns its id (>= 0; valid until lp_engine_release). */
int lp_engine_submit(lp_engine *engine, const lp_request *request, lp_error *err);
/* One batch. Returns the number of requests not yet done (0: idle), -1 on an
 * error the engine cannot attribute to one request. */
int lp_engine_step(lp_engine *engine, lp_error *err);
/* Steps until every request is done. */
int lp_engine_run(lp_engine *engine, lp_error *err);
/* Ends a request at the next step boundary ("cancelled"); its KV is freed. */
int lp_engine_cancel(lp_engine *engine, int request, lp_error *err);
int lp_engine_request_stats(const lp_engine *engine, int request,
                            lp_request_stats *stats);
/* Tokens it generated so far (owned by the engine, valid until it next steps). */
const int32_t *lp_engine_request_tokens(const lp_engine *engine, int request, int *n);
/* Forgets a done request (its id may be given to a later one). */
void lp_engine_release(lp_engine *engine, int request);
/* Forward passes run (all steps) and rows computed, for reports. */
void lp_engine_counts(const lp_engine *engine, int64_t *steps, int64_t *rows);

/* ---- speculative decoding: forecast embeddings, trees, prompt lookup ------- */

/* DS2D-style self-speculation without a draft model (docs/speculate.md).
 * A forecast set is k learned input embeddings (an .lpf file) trained for
 * one base and optionally one adapter: fed after a real token as rows of a
 * bound embedding table, their logits guess the tokens after the next one.
 * The engine then verifies those guesses as a tree of rows in the next
 * batch and commits only the accepted path (lp_commit_rows); forecast rows
 * and rejected rows are never committed, so no real token ever attends to
 * them and greedy output is token for token that of plain decoding.
 * (lp_forecast is declared with the other handles, at the top.) */

/* Loads and validates an .lpf file (errors name the file). */
lp_forecast *lp_forecast_load(const char *path, lp_error *err);
/* The same from an image in memory; `what` names it in messages. */
lp_forecast *lp_forecast_from_memory(const void *data, size_t size, const char *what,
                                     lp_error *err);
/* A forecast set of k embeddings (k x dim floats, copied) for this model,
 * recording its fingerprint and the adapter name (NULL / "": the base). */
lp_forecast *lp_forecast_create(const lp_model *model, int k, const float *embd,
                                const char *adapter_name, lp_error *err);
int lp_forecast_save(const lp_forecast *f, const char *path, lp_error *err);
void lp_forecast_free(lp_forecast *f);
/* 0 if the set fits the model (width, vocabulary and base fingerprint);
 * else LP_ERR_FORMAT saying what differs. */
int lp_forecast_check(const lp_forecast *f, const lp_model *model, lp_error *err);
int lp_forecast_k(const lp_forecast *f);
int lp_forecast_dim(const lp_forecast *f);
const float *lp_forecast_data(const lp_forecast *f);        /* [k][dim] */
const char *lp_forecast_adapter_name(const lp_forecast *f); /* "" for the base */
/* A draft corpus: the model's own greedy outputs for the task's training
 * prompts, each after its prompt's last tokens, sequences separated by -1
 * (copied; every other token < the set's vocabulary size). The engine then
 * drafts a chain from the n-gram table built from it (lp_speculate.ngram_len),
 * next to the forecast rows; saved files carry it (.lpf version 2). n = 0
 * removes it. */
int lp_forecast_set_corpus(lp_forecast *f, const int32_t *tokens, int n, lp_error *err);
int lp_forecast_corpus_size(const lp_forecast *f);
/* The token that most often followed the last 3, else 2, else 1 tokens of
 * history[0..n-1] in the corpus (the longest context it has seen decides; a
 * single token's must have been seen twice), or -1. */
int lp_forecast_ngram_next(const lp_forecast *f, const int32_t *history, int n);
/* A learned KV prefix that only the set's forecast rows attend to, in every
 * layer, besides their context (lp_context_bind_kv_prefix's layout:
 * [n_layers][2][n][n_kv_heads * head_dim], keys roped at positions 0..n-1),
 * copied; n = 0 removes it. Saved files carry it (.lpf version 4). */
int lp_forecast_set_prefix(lp_forecast *f, const lp_model *model, const float *kv, int n, lp_error *err);
int lp_forecast_prefix_len(const lp_forecast *f);        /* entries (0: none) */
const float *lp_forecast_prefix(const lp_forecast *f);    /* NULL: none */
size_t lp_forecast_prefix_floats(const lp_forecast *f);

#define LP_SPEC_MAX_DEPTH 8
#define LP_SPEC_MAX_NODES 64
#define LP_SPEC_COST_ROWS 64

/* How a request speculates (lp_request.speculate). Greedy or sampled, the
 * output is the plain output (for a seed, token for token); a speculative
 * request's sampler is its own (lp_request.sampler NULL) or a borrowed one
 * no other unfinished request uses, unless both are greedy (their draws
 * would interleave differently); lp_engine_submit refuses others
 * (LP_ERR_INVALID).
 * The engine binds forecast sets to the context's embedding tables
 * (1..max_embd_tables) while requests use them; rows it cannot fit (rows,
 * logit rows, sequence length) are left out, which only lowers acceptance.
 * The context needs logit rows for them: (1 + nodes) x (1 + depth) per
 * request, e.g. 30 for {3, 2}. */
typedef struct lp_speculate {
    const lp_forecast *forecast; /* NULL: no forecast rows (prompt lookup only);
                                    must outlive the request */
    int depth;                   /* forecast rows after every tree node, 0..min(k, 8) */
    int branches[LP_SPEC_MAX_DEPTH]; /* candidates taken at each depth from the
                                    forecast logits: {3, 2} is 3 first tokens x 2
                                    second ones (9 nodes), {1, 1, 1} a chain of 3 */
    int lookup_ngram;            /* > 0: prompt lookup: find an earlier occurrence of
                                    the last n..1 tokens ... */
    int lookup_len;              /* ... and propose the (at most) lookup_len tokens
                                    that followed it, as up to two more chains
                                    (docs/speculate.md) */
    int ngram_len;               /* tokens drafted as one more chain from the forecast
                                    set's corpus (lp_forecast_set_corpus), when it has
                                    one: 0 means 8; < 0: none */
    int max_nodes;               /* candidate nodes per step (0: LP_SPEC_MAX_NODES) */
    float pass_cost[LP_SPEC_COST_ROWS]; /* all 0: place every candidate. Else [r - 1] is
                                    the cost of one forward of r rows relative to
                                    one row (lp_speculate_measure_cost), and each
                                    step places the most likely candidates (by the
                                    request's own acceptance counts) that maximise
                                    expected tokens per cost, down to none */
} lp_speculate;

/* forecast NULL, depth 0, prompt lookup off, no cost model. */
lp_speculate lp_speculate_default(void);
/* The settings a stream on a slot of ctx speculates with under sp
 * (lp_generate_params.speculate): sp itself where it names a forecast set,
 * else sp with the set bound to the slot (lp_context_bind_forecast) and the
 * depth cut to its k (0 where none is bound). */
lp_speculate lp_speculate_for_slot(const lp_context *ctx, const lp_speculate *sp, int slot);

/* Times forwards of 1..n rows (a chain after a context of ctx_len tokens, on
 * the context's last sequence, which must be empty and is left empty) and
 * writes cost[r - 1] = time(r rows) / time(1 row), made non-decreasing. Call
 * it while nothing else uses the context; n <= LP_SPEC_COST_ROWS. */
int lp_speculate_measure_cost(lp_context *ctx, int ctx_len, float *cost, int n, lp_error *err);

/* Speculation counters of a request (zeros for a plain one). */
int lp_engine_request_spec_stats(const lp_engine *engine, int request, lp_spec_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
