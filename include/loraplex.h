/* loraplex: one frozen Llama-family model, many adapters, on a CPU.
 *
 * The whole public C API. Opaque handles, explicit errors (every fallible call
 * takes an lp_error * and returns NULL / negative on failure with a
 * human-readable message in err->message), no global state. A model is
 * immutable after loading and may be shared by any number of contexts; a
 * context is used by one thread at a time. */
#ifndef LORAPLEX_H
#define LORAPLEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lp_error {
    char message[512];
} lp_error;

#ifdef __cplusplus
}
#endif

#endif
