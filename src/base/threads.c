/* A small fork-join thread pool.
 *
 * Decode runs a few hundred parallel sections per token, so waking workers
 * must be cheap: workers spin on an atomic generation counter for a short
 * while before sleeping on a condition variable. The caller is thread 0. */

#include "base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIN_ITERATIONS 20000

struct lp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    atomic_uint generation;   /* bumped once per task */
    atomic_int pending;       /* workers still running the current task */
    atomic_bool quit;
    lp_task_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    lp_threadpool *pool;
    int index;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    lp_threadpool *pool = arg.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->quit)) {
            if (++spins < SPIN_ITERATIONS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->quit))
                pthread_cond_wait(&pool->wake, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->quit)) return NULL;
        seen = gen;
        pool->fn(pool->ctx, arg.index, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

lp_threadpool *lp_threadpool_create(int n_threads, lp_error *err) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > LP_THREADS_MAX) {
        lp_fail(err, "thread count %d is more than %d", n_threads, LP_THREADS_MAX);
        return NULL;
    }
    lp_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        lp_error_set(err, LP_ERR_NOMEM, "out of memory creating thread pool");
        return NULL;
    }
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        lp_threadpool_destroy(pool);
        lp_error_set(err, LP_ERR_NOMEM, "out of memory creating thread pool");
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main,
                                   (arg->pool = pool, arg->index = i, arg)) != 0) {
            free(arg);
            pool->n_threads = i; /* join only the started ones */
            lp_threadpool_destroy(pool);
            lp_fail(err, "cannot start worker thread %d", i);
            return NULL;
        }
    }
    return pool;
}

void lp_threadpool_destroy(lp_threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->quit, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    if (pool->threads)
        for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    free(pool->threads);
    free(pool);
}

int lp_threadpool_size(const lp_threadpool *pool) { return pool ? pool->n_threads : 1; }

void lp_threadpool_run(lp_threadpool *pool, lp_task_fn fn, void *ctx) {
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    fn(ctx, 0, pool->n_threads);
    /* Spin briefly (workers usually finish together), then yield so a
     * descheduled worker on a busy machine can get the core. */
    for (int spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ITERATIONS) cpu_relax();
        else sched_yield();
    }
}

void lp_split_range(int64_t n, int thread_index, int n_threads, int64_t align,
                    int64_t *begin, int64_t *end) {
    if (align < 1) align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t per = units / n_threads, extra = units % n_threads;
    int64_t b = thread_index * per + (thread_index < extra ? thread_index : extra);
    int64_t e = b + per + (thread_index < extra ? 1 : 0);
    b *= align;
    e *= align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

int lp_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    return (int)n;
}
