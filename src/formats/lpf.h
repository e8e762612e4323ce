/* .lpf: a forecast-embedding file (DS2D). k learned input embeddings that
 * stand in for "the tokens to come" in a speculative step, trained for one
 * base (and optionally one adapter). Small and copied into memory. All
 * integers little-endian.
 *
 *   offset size  field
 *   0      4     magic "LPF1"
 *   4      4     version (1)
 *   8      4     dim               embedding width (the base's dim), 1..65536
 *   12     4     k                 forecast embeddings, 1..LP_LPF_MAX_K
 *   16     4     n_vocab           the base's vocabulary (0: not recorded)
 *   20     4     name_len          bytes of the adapter name, 0..255
 *   24     8     base_fingerprint  lp_model_fingerprint of the base (0: any)
 *   32     8     data_checksum     lp_lpa_hash (LP_LPA_HASH_SEED) of the embedding bytes
 *   40     4     n_corpus          version 2: tokens of the draft corpus (0..LP_LPF_MAX_CORPUS);
 *                                  version 1: reserved, zero
 *   44     20    reserved, zero
 *   64     name_len  adapter name (UTF-8, no NUL; empty: the base alone)
 *   ...    zero padding to a multiple of 4
 *   ...    k x dim f32, row-major (all finite)
 *   ...    version 2: n_corpus u32, each a token id < n_vocab (which must be
 *          recorded) or LP_LPF_SEPARATOR between sequences
 *   the file ends there (its size is exactly that). The checksum covers the
 *   embeddings and the corpus.
 *
 * The draft corpus is the model's own greedy outputs for the task's
 * training prompts (each after its prompt's last tokens): the engine
 * drafts chains from the n-gram table built from it at load
 * (lp_forecast_ngram_next). A set without one is written as version 1. */
#ifndef LP_LPF_H
#define LP_LPF_H

#include <stddef.h>
#include <stdint.h>

#include "loraplex.h"

#define LP_LPF_MAGIC "LPF1"
#define LP_LPF_VERSION 2 /* the newest this build reads and writes; it reads 1 too */
#define LP_LPF_MAX_CORPUS (1 << 20)
#define LP_LPF_SEPARATOR 0xffffffffu
#define LP_LPF_NGRAM 3 /* the longest context the n-gram table keys on */
#define LP_LPF_HEADER_BYTES 64
#define LP_LPF_MAX_K 64
#define LP_LPF_MAX_DIM 65536
#define LP_LPF_NAME_BYTES 256

/* Parses an .lpf image (any alignment). `what` names it in messages. */
lp_forecast *lp_lpf_parse(const uint8_t *data, size_t size, const char *what, lp_error *err);

#endif
