/* loraplex serve: options, the demo world by default, then the server
 * (src/server/server.h). */
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifdef LP_HAVE_SERVER
#include "../server/server.h"

static void serve_usage(FILE *out) {
    fprintf(out,
            "usage: loraplex serve [-m MODEL] [--adapter NAME=PATH ...] [--adapter-dir DIR] [options]\n"
            "  -m, --model PATH        the base (default: the demo world's, with its task adapters)\n"
            "      --adapter NAME=PATH an adapter requests select with \"model\": \"NAME\" (repeatable)\n"
            "      --adapter-dir DIR   every *.lpa in DIR, named by its file name; and the only\n"
            "                          place POST /v1/load_lora_adapter may load from\n"
            "      --max-lora-rank N   highest rank a hot-loaded adapter may have (default: the\n"
            "                          startup adapters' highest, at least 64)\n"
            "      --host ADDR         IPv4 address to listen on (default 127.0.0.1)\n"
            "      --port N            (default 8080; 0: any free port, printed)\n"
            "      --api-key KEY       require \"Authorization: Bearer KEY\" on /v1/\n"
            "      --parallel N        requests decoded together (default 16)\n"
            "      --max-queue N       requests waiting beyond those before 503 (default 64)\n"
            "      --max-tokens N      default and limit of max_tokens (default 1024)\n"
            "  -c, --ctx N             KV tokens shared by all requests (default 4096 per 4 parallel)\n"
            "  -t, --threads N         worker threads (default: all cores)\n"
            "  -q, --quiet             no line per request\n"
            "speculative decoding (docs/speculate.md; the output is the plain output):\n"
            "      --forecast NAME=PATH forecast embeddings (.lpf) for requests of adapter NAME\n"
            "                          (or the base, by its name; repeatable)\n"
            "      --speculate MODE    requests' default: off (default), lookup (prompt lookup\n"
            "                          only), on (forecast set where bound + lookup), auto (as on,\n"
            "                          pruned by the cost model measured at startup); a request\n"
            "                          overrides it\n"
            "                          with \"speculate\": true|false; logprobs decode plainly\n"
            "      --lookup N[:L]      prompt lookup: n-gram N, L tokens (default 3:8)\n"
            "      --tree B1,B2,...    candidates per forecast depth (default 3,2)\n"
            "endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true for SSE),\n"
            "GET /v1/models, POST /v1/load_lora_adapter, /v1/unload_lora_adapter, /tokenize,\n"
            "/detokenize, GET /health, /metrics, and the chat page at /.\n");
}

typedef struct serve_names {
    char buf[LP_SERVER_MAX_ADAPTERS][2 * PATH_MAX];
    int n;
    char forecast[LP_SERVER_MAX_ADAPTERS][2 * PATH_MAX];
    char demo_base[PATH_MAX + 32], demo_adapters[PATH_MAX + 32];
} serve_names;

static bool add_adapter(lp_server_params *p, serve_names *names, const char *name, size_t name_len, const char *path) {
    if (p->n_adapters == LP_SERVER_MAX_ADAPTERS) {
        fprintf(stderr, "loraplex serve: at most %d adapters\n", LP_SERVER_MAX_ADAPTERS);
        return false;
    }
    char *b = names->buf[names->n++];
    snprintf(b, PATH_MAX, "%.*s", (int)name_len, name);
    snprintf(b + PATH_MAX, PATH_MAX, "%s", path);
    p->adapter_names[p->n_adapters] = b;
    p->adapter_paths[p->n_adapters] = b + PATH_MAX;
    p->n_adapters++;
    return true;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every *.lpa of dir, in name order. */
static bool add_dir(lp_server_params *p, serve_names *names, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "loraplex serve: cannot read --adapter-dir %s\n", dir);
        return false;
    }
    char *files[LP_SERVER_MAX_ADAPTERS];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < LP_SERVER_MAX_ADAPTERS) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".lpa")) files[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(files, (size_t)n, sizeof *files, cmp_str);
    bool ok = true;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        if (!files[i] || snprintf(path, sizeof path, "%s/%s", dir, files[i]) >= (int)sizeof path) ok = false;
        else ok = ok && add_adapter(p, names, files[i], strlen(files[i]) - 4, path);
        free(files[i]);
    }
    return ok;
}

static bool add_forecast(lp_server_params *p, serve_names *names, const char *s) {
    const char *eq = s ? strchr(s, '=') : NULL;
    if (!eq || eq == s || !eq[1] || eq - s >= PATH_MAX) {
        fprintf(stderr, "loraplex serve: --forecast wants NAME=PATH\n");
        return false;
    }
    if (p->n_forecasts == LP_SERVER_MAX_ADAPTERS) {
        fprintf(stderr, "loraplex serve: at most %d forecast sets\n", LP_SERVER_MAX_ADAPTERS);
        return false;
    }
    char *b = names->forecast[p->n_forecasts];
    snprintf(b, PATH_MAX, "%.*s", (int)(eq - s), s);
    snprintf(b + PATH_MAX, PATH_MAX, "%s", eq + 1);
    p->forecast_names[p->n_forecasts] = b;
    p->forecast_paths[p->n_forecasts] = b + PATH_MAX;
    p->n_forecasts++;
    return true;
}

/* --tree 3,2 and --lookup 3:8 */
static bool parse_tree(lp_server_params *p, const char *s) {
    int n = 0;
    while (s && *s) {
        char *end;
        long b = strtol(s, &end, 10);
        if (end == s || b < 1 || b > LP_SPEC_MAX_NODES || n == LP_SPEC_MAX_DEPTH || (*end && *end != ',')) n = -1;
        if (n < 0) break;
        p->tree[n++] = (int)b;
        s = *end == ',' ? end + 1 : end;
    }
    if (n <= 0) {
        fprintf(stderr, "loraplex serve: --tree wants up to %d counts 1..%d, like 3,2\n", LP_SPEC_MAX_DEPTH,
                LP_SPEC_MAX_NODES);
        return false;
    }
    p->tree_depth = n;
    return true;
}

static bool parse_lookup(lp_server_params *p, const char *s) {
    char *end = NULL;
    long g = s ? strtol(s, &end, 10) : 0, len = 8;
    if (end && *end == ':') len = strtol(end + 1, &end, 10);
    if (!end || *end || g < 1 || g > 16 || len < 1 || len > LP_SPEC_MAX_NODES) {
        fprintf(stderr, "loraplex serve: --lookup wants N (1..16) or N:L (L 1..%d)\n", LP_SPEC_MAX_NODES);
        return false;
    }
    p->lookup_ngram = (int)g;
    p->lookup_len = (int)len;
    return true;
}

static int serve(int argc, char **argv, serve_names *names) {
    lp_server_params p = lp_server_default_params();
    const char *adapter_dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(p.model = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--adapter")) {
            const char *s = cli_value(argc, argv, &i), *eq = s ? strchr(s, '=') : NULL;
            if (!eq || eq == s || !eq[1]) {
                fprintf(stderr, "loraplex serve: --adapter wants NAME=PATH\n");
                return 2;
            }
            if (!add_adapter(&p, names, s, (size_t)(eq - s), eq + 1)) return 2;
        } else if (!strcmp(a, "--adapter-dir")) {
            if (!(adapter_dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-lora-rank")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 1, 65536, &v)) return 2;
            p.max_lora_rank = (int)v;
        } else if (!strcmp(a, "--host")) {
            if (!(p.host = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--api-key")) {
            if (!(p.api_key = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 0, 65535, &v)) return 2;
            p.port = (int)v;
        } else if (!strcmp(a, "--parallel")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 1, 256, &v)) return 2;
            p.parallel = (int)v;
        } else if (!strcmp(a, "--max-queue")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 0, 4096, &v)) return 2;
            p.max_queue = (int)v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 1, 1 << 20, &v)) return 2;
            p.max_tokens = (int)v;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 16, 1 << 24, &v)) return 2;
            p.n_ctx = (int)v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_int(a, cli_value(argc, argv, &i), 1, 1024, &v)) return 2;
            p.n_threads = (int)v;
        } else if (!strcmp(a, "--forecast")) {
            if (!add_forecast(&p, names, cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tree")) {
            if (!parse_tree(&p, cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--lookup")) {
            if (!parse_lookup(&p, cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--speculate")) {
            const char *m = cli_value(argc, argv, &i);
            if (!m) return 2;
            if (!strcmp(m, "off")) p.speculate = LP_SERVER_SPEC_OFF;
            else if (!strcmp(m, "lookup")) p.speculate = LP_SERVER_SPEC_LOOKUP;
            else if (!strcmp(m, "on")) p.speculate = LP_SERVER_SPEC_ON;
            else if (!strcmp(m, "auto")) p.speculate = LP_SERVER_SPEC_AUTO;
            else {
                fprintf(stderr, "loraplex serve: --speculate wants off, lookup, on or auto\n");
                return 2;
            }
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            p.quiet = true;
        } else {
            fprintf(stderr, "loraplex serve: unknown option '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
    }
    if (!p.model) {
        char dir[PATH_MAX];
        if (!cli_find_demo_dir(dir, sizeof dir)) {
            fprintf(stderr, "loraplex serve: no -m MODEL and no demo world (models/demo-v2) found\n");
            return 2;
        }
        snprintf(names->demo_base, sizeof names->demo_base, "%s/base.gguf", dir);
        p.model = names->demo_base;
        if (!adapter_dir && p.n_adapters == 0) {
            snprintf(names->demo_adapters, sizeof names->demo_adapters, "%s/adapters", dir);
            adapter_dir = names->demo_adapters;
        }
    }
    if (adapter_dir && !add_dir(&p, names, adapter_dir)) return 2;
    p.adapter_dir = adapter_dir;
    /* a client that goes away mid-stream must not kill the server */
    signal(SIGPIPE, SIG_IGN);
    lp_error err = {0};
    if (lp_server_run(&p, &err)) return cli_fail("serve", &err);
    return 0;
}

int cli_serve(int argc, char **argv) {
    serve_names *names = calloc(1, sizeof *names); /* adapter names and paths while it runs */
    if (!names) return 1;
    int rc = serve(argc, argv, names);
    free(names);
    return rc;
}

#else

int cli_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "loraplex serve: this build has no server (libmicrohttpd was not found; "
                    "install libmicrohttpd-dev and rebuild)\n");
    return 2;
}

#endif
