/* Training forecast embeddings (DS2D) by self-distillation: the targets are
 * the frozen model's own greedy continuations of prompts (with an optional
 * adapter), so no labels are needed. Only the k extra input embeddings are
 * trained (the trainer's "extra" group); base and LoRA stay frozen.
 *
 * A training row is one teacher sequence x_0..x_{n-1} followed by G groups
 * of k forecast rows. Group g hangs after an anchor t (the last prompt
 * token or later): its row j (input: extra embedding j) is at position
 * t + 1 + j, sees x_0..x_t and rows 0..j of its group, and is trained to
 * predict x_{t+2+j} -- in the engine, forecast row j after a node guesses
 * the token j + 1 places after the token that node's own logits give.
 *
 * With a KV prefix of P entries, each training row also holds P prefix
 * rows (inputs: extra embeddings k..k+P-1, positions 0..P-1, seeing only
 * each other, causally) that every forecast row sees and no teacher row
 * does. The trained prefix is stored as what the runtime attends to: their
 * keys and values in every layer (lp_forecast_set_prefix), so a deep
 * prefix costs the file P x layers x 2 x kv_dim floats and the runtime
 * nothing but P more attention entries per forecast row. */
#ifndef LP_TRAIN_FORECAST_H
#define LP_TRAIN_FORECAST_H

#include <stdint.h>

#include "../base/base.h"

typedef struct lp_forecast_train_params {
    const lp_model *base;
    const lp_adapter *adapter;       /* NULL: the base alone */
    const int32_t *const *prompts;   /* tokenized prompts (BOS included as the model wants) */
    const int *n_prompt;
    int n_prompts;
    int n_eval;                      /* the last n_eval prompts are held out for evaluation */
    int k;                           /* forecast embeddings, 1..LP_SPEC_MAX_DEPTH */
    int prefix;                      /* entries of a learned KV prefix only forecast rows
                                        see, 0..LP_MAX_KV_PREFIX (0: none) */
    int n_continue;                  /* teacher tokens per prompt (default 48) */
    int steps, batch, anchors;       /* default 200, 8, 8 */
    float lr;                        /* default 0.02 */
    uint64_t seed;
    int threads;                     /* 0: all cores */
    int eval_tokens;                 /* tokens decoded per eval prompt (default 48) */
    lp_speculate eval_tree;          /* the tree the acceptance eval uses (forecast/depth
                                        filled in; depth 0: a chain of k) */
    bool quiet;                      /* no progress lines on stderr */
    bool no_corpus;                  /* don't attach the teacher outputs as the set's
                                        draft corpus (lp_forecast_set_corpus) */
    size_t max_bytes;                /* the file's size limit: the corpus keeps the first
                                        prompts' outputs that fit (0: no limit) */
    const char *checkpoint;          /* written every checkpoint_every steps (0: only at
                                        the end) and where the run stops (NULL: none) */
    int checkpoint_every;
    const char *resume;              /* a checkpoint to continue from (NULL: a fresh
                                        start): the same base, adapter, k, steps and lr
                                        give the file an uninterrupted run gives */
    int stop_after;                  /* > 0: stop after this many steps of this run (the
                                        schedule still spans `steps`); the set returned
                                        is the one trained so far */
} lp_forecast_train_params;

typedef struct lp_forecast_train_report {
    double first_loss, last_loss;
    double eval_tokens_per_pass_before, eval_tokens_per_pass_after;
    double eval_tokens_per_pass_embeddings; /* trained, without the corpus (with one: else = after) */
    int n_corpus;                    /* tokens of the draft corpus attached */
    int corpus_sequences, corpus_dropped; /* teacher outputs in it / left out (max_bytes,
                                        or LP_LPF_MAX_CORPUS) */
    int resumed_step;                /* the step the run continued from (0: a fresh start) */
    int stopped_at;                  /* the step stop_after ended it at (0: it ran to the end) */
    int n_teacher_tokens;
    double seconds;
} lp_forecast_train_report;

/* Trains and returns the forecast set (for p->base; the adapter's name
 * recorded), or NULL with err set. report may be NULL. */
lp_forecast *lp_forecast_train(const lp_forecast_train_params *p, lp_forecast_train_report *report,
                               lp_error *err);

#endif
