/* loraplex command-line tool: one binary, one subcommand per job.
 * Generated text goes to stdout; logs, timings and errors to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *out) {
    fprintf(out,
            "loraplex %s: a multi-adapter LLM runtime for CPUs\n\n"
            "usage: loraplex COMMAND [options]\n\n"
            "commands:\n"
            "  demo      the built-in demonstration            (loraplex demo)\n"
            "  run       generate text from a prompt          (loraplex run -m MODEL -p TEXT)\n"
            "  serve     OpenAI-compatible server and chat page (loraplex serve [-m MODEL])\n"
            "  info      describe a model file                (loraplex info MODEL)\n"
            "  tokenize  print the tokens of a text           (loraplex tokenize MODEL TEXT)\n"
            "  adapter   inspect, compile or merge LoRA adapters (loraplex adapter info PATH)\n"
            "  compile   pack a model into a memory-mappable .lpx (q4/q8/f16 weights)\n"
            "  quantize  write a GGUF with Q8_0/Q4_0 matrices (loraplex quantize IN OUT --type q4_0)\n"
            "  bench     prefill/decode speed, bandwidth roofline, streams, adapter modes\n"
            "  eval      perplexity, and KL divergence against a reference model\n"
            "  world     write the demo world: corpus, tasks, vocabulary (loraplex world --out DIR)\n"
            "  eval-tasks  exact match and chrF per task, f32 vs quantized  (see --help)\n"
            "  train     train a model from scratch (loraplex train --help)\n"
            "  train-lora  train a LoRA adapter on a frozen base (loraplex train-lora --help)\n"
            "  synth     write a random model of a real shape (loraplex synth --preset NAME -o OUT)\n"
            "  image     text to image with a Stable Diffusion 1.x checkpoint (loraplex image --help)\n"
            "  forecast-random  random forecast embeddings (.lpf) for run --speculate (tests, baseline)\n"
            "  train-forecast   train forecast embeddings by self-distillation (see --help)\n"
            "  quad      QUAD shared quantization profile for all adapters (loraplex quad --help)\n"
            "\nrun 'loraplex COMMAND --help' for a command's options.\n",
            LORAPLEX_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("loraplex %s\n", LORAPLEX_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "demo")) return cli_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "adapter")) return cli_adapter(argc - 1, argv + 1);
    if (!strcmp(cmd, "compile")) return cli_compile(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cli_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "world")) return cli_world(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "train-lora")) return cli_train_lora(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval-tasks")) return cli_eval_tasks(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "image")) return cli_image(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "forecast-random")) return cli_forecast_random(argc - 1, argv + 1);
    if (!strcmp(cmd, "train-forecast")) return cli_train_forecast(argc - 1, argv + 1);
    if (!strcmp(cmd, "quad")) return cli_quad(argc - 1, argv + 1);
    fprintf(stderr, "loraplex: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
