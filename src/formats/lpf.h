/* .lpf: a forecast-embedding file (DS2D). k learned input embeddings that
 * stand in for "the tokens to come" in a speculative step, trained for one
 * base (and optionally one adapter). Small and copied into memory. All
 * integers little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPF1"
 *   4      4     version (1 to 4)
 *   8      4     dim               embedding width (the base's dim), 1..65536
 *   12     4     k                 forecast embeddings, 1..LP_LPF_MAX_K
 *   16     4     n_vocab           the base's vocabulary (0: not recorded)
 *   20     4     name_len          bytes of the adapter name, 0..255
 *   24     8     base_fingerprint  lp_model_fingerprint of the base (0: any)
 *   32     8     data_checksum     lp_lpa_hash (LP_LPA_HASH_SEED) of the embedding bytes
 *   40     4     n_corpus          version 2, 3: tokens of the draft corpus (1..LP_LPF_MAX_CORPUS);
 *                                  version 1: reserved, zero
 *   44     4     token_bits        versions 3, 4: bits per corpus token, the fewest b
 *                                  with n_vocab <= 2^b - 1 (lp_lpf_token_bits; 0
 *                                  without a corpus); versions 1, 2: reserved, zero
 *                                  (version 2 has 32)
 *   48     4     n_prefix          version 4: entries of the KV prefix, 1..LP_MAX_KV_PREFIX
 *   52     4     n_layers          version 4: the base's layers, 1..LP_LPF_MAX_LAYERS
 *   56     4     kv_dim            version 4: n_kv_heads x head_dim, 1..LP_LPF_MAX_DIM
 *   ...    (versions 1-3: reserved, zero from 48)
 *   60     4     reserved, zero
 *   64     name_len  adapter name (UTF-8, no NUL; empty: the base alone)
 *   ...    zero padding to a multiple of 4
 *   ...    k x dim f32, row-major (all finite)
 *   ...    version 4: the KV prefix, n_layers x 2 x n_prefix x kv_dim f32 (all
 *          finite): per layer the keys (roped at positions 0..n_prefix-1),
 *          then the values -- what forecast rows alone attend to besides
 *          their context (lp_context_bind_kv_prefix)
 *   ...    versions 2, 3: the corpus, n_corpus tokens of token_bits bits packed
 *          least significant bit first (token i is bits i*b .. i*b+b-1 of the
 *          bytes read as one little-endian number; version 2 is so u32s),
 *          ceil(n_corpus*b/8) bytes, the bits after the last token zero. Each
 *          is a token id < n_vocab (which must be recorded) or, all b bits
 *          set, the separator between sequences.
 *   the file ends there (its size is exactly that). The checksum covers the
 *   embeddings and the corpus.
 *
 * The draft corpus is the model's own greedy outputs for the task's
 * training prompts (each after its prompt's last tokens): the engine
 * drafts chains from the n-gram table built from it at load
 * (lp_forecast_ngram_next). A set without one is written as version 1,
 * one with a corpus as version 3 (version 2, u32 tokens, is still read), one
 * with a KV prefix as version 4. */
#ifndef LP_LPF_H
#define LP_LPF_H

#include <stddef.h>
#include <stdint.h>

#include "loraplex.h"

#define LP_LPF_MAGIC "LPF1"
#define LP_LPF_VERSION 4 /* the newest this build reads and writes; it reads 1-3 too */
#define LP_LPF_MAX_LAYERS 4096
#define LP_LPF_MAX_CORPUS (1 << 20)
#define LP_LPF_NGRAM 3 /* the longest context the n-gram table keys on */
#define LP_LPF_HEADER_BYTES 64
#define LP_LPF_MAX_K 64
#define LP_LPF_MAX_DIM 65536
#define LP_LPF_NAME_BYTES 256

/* Bits per corpus token for a vocabulary of n_vocab (1..32). */
int lp_lpf_token_bits(uint32_t n_vocab);
/* Bytes of the file lp_forecast_save writes for a set of k x dim, an
 * adapter name of name_len bytes, a corpus of n_corpus tokens and a KV
 * prefix of prefix_floats floats. */
size_t lp_lpf_file_bytes(int k, int dim, size_t name_len, int n_vocab, size_t n_corpus, size_t prefix_floats);

/* Parses an .lpf image (any alignment). `what` names it in messages. */
lp_forecast *lp_lpf_parse(const uint8_t *data, size_t size, const char *what, lp_error *err);

#endif
