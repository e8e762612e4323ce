/* Subcommands of the loraplex tool and their shared option parsing. */
#ifndef LP_CLI_H
#define LP_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loraplex.h"

int cli_demo(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_adapter(int argc, char **argv);
int cli_world(int argc, char **argv);
int cli_compile(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_train_lora(int argc, char **argv);
int cli_eval_tasks(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_quad(int argc, char **argv);
/* image models (cli_image.c): synth's sd15 / sd-tiny presets */
bool cli_is_image_preset(const char *name);
int cli_synth_image(int argc, char **argv);
int cli_image(int argc, char **argv);
/* loraplex compile of an SD checkpoint: weights LP_W8 or LP_F32 */
int cli_image_compile(const char *in, const char *out, uint32_t weight_type, bool int8_activations);

/* The demo world's folder (base.gguf and the adapters folder of .lpa files):
 * LORAPLEX_DEMO_DIR, else models/demo-v2 (else version 1's models/demo)
 * beside the executable or above it, else in the current directory. */
bool cli_find_demo_dir(char *out, size_t cap);
int cli_forecast_random(int argc, char **argv);
int cli_train_forecast(int argc, char **argv);

/* Option parsing: each returns false (after printing why) on a bad value. */
bool cli_int(const char *opt, const char *text, long min, long max, long *out);
bool cli_float(const char *opt, const char *text, double min, double max, double *out);
/* argv[i] must have a value after it; returns it and advances i. */
const char *cli_value(int argc, char **argv, int *i);

/* Prints "loraplex: <what>: <message>" and returns 1. */
int cli_fail(const char *what, const lp_error *err);
/* The "prompt" of every JSON line of path (the first max; 0: all), tokenized
 * with the model's BOS: n > 0 prompts in *out / *lens (each and both
 * arrays malloc'd), or -1 with err naming the file and line. */
int cli_load_prompts(const lp_model *m, const char *path, int max, int32_t ***out, int **lens, lp_error *err);

#endif
