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
            "endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true for SSE),\n"
            "GET /v1/models, POST /v1/load_lora_adapter, /v1/unload_lora_adapter, /tokenize,\n"
            "/detokenize, GET /health, /metrics, and the chat page at /.\n");
}

typedef struct serve_names {
    char buf[LP_SERVER_MAX_ADAPTERS][2 * PATH_MAX];
    int n;
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
            fprintf(stderr, "loraplex serve: no -m MODEL and no demo world (models/demo) found\n");
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
