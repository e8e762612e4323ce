/* base: errors, memory, files, half floats, RNG, UTF-8, time. */

#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------ */

static int set_error(lp_error *err, lp_status status, const char *fmt, va_list ap) {
    if (err) {
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        err->status = status;
    }
    return -1;
}

int lp_fail(lp_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(err, LP_ERR_INVALID, fmt, ap);
    va_end(ap);
    return -1;
}

int lp_error_set(lp_error *err, lp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(err, status, fmt, ap);
    va_end(ap);
    return -1;
}

void lp_error_as_format(lp_error *err) {
    if (err && err->status == LP_ERR_INVALID) err->status = LP_ERR_FORMAT;
}

const char *lp_status_name(lp_status status) {
    switch (status) {
    case LP_OK: return "ok";
    case LP_ERR_INVALID: return "invalid argument";
    case LP_ERR_NOMEM: return "out of memory";
    case LP_ERR_KV_FULL: return "KV cache full";
    case LP_ERR_CANCELLED: return "cancelled";
    case LP_ERR_IO: return "I/O error";
    case LP_ERR_FORMAT: return "format error";
    }
    return "unknown status";
}

int lp_fail_prefix(lp_error *err, const char *fmt, ...) {
    if (err) {
        char prefix[256], old[sizeof err->message];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->message, sizeof old);
        old[sizeof old - 1] = 0;
        size_t plen = strlen(prefix);
        if (plen > sizeof err->message - 3) plen = sizeof err->message - 3;
        memcpy(err->message, prefix, plen);
        memcpy(err->message + plen, ": ", 2);
        size_t rest = sizeof err->message - plen - 3;
        size_t olen = strnlen(old, rest);
        memcpy(err->message + plen + 2, old, olen);
        err->message[plen + 2 + olen] = 0;
    }
    return -1;
}

/* ---- memory ------------------------------------------------------------ */

void *lp_alloc_uninit(size_t size) {
    size_t rounded;
    if (size == 0) size = 1;
    if (!lp_add_ok(size, LP_ALIGN - 1, &rounded)) return NULL;
    rounded &= ~(size_t)(LP_ALIGN - 1);
    return aligned_alloc(LP_ALIGN, rounded);
}

void *lp_alloc(size_t size) {
    void *p = lp_alloc_uninit(size);
    /* the padding up to the alignment too: kernels may read whole vectors */
    if (p) memset(p, 0, ((size ? size : 1) + LP_ALIGN - 1) & ~(size_t)(LP_ALIGN - 1));
    return p;
}

#define HUGE_PAGE ((size_t)2 << 20)

bool lp_huge_pages_available(void) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char mode[128] = {0};
    size_t n = fread(mode, 1, sizeof mode - 1, f);
    fclose(f);
    mode[n] = 0;
    return strstr(mode, "[always]") || strstr(mode, "[madvise]");
#else
    return false;
#endif
}

/* Asks for 2 MiB pages for the whole 2 MiB blocks inside [p, p + size),
 * before the memory is first touched; a no-op where there are none. */
static void advise_huge(void *p, size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    uintptr_t b = ((uintptr_t)p + size) & ~(uintptr_t)(HUGE_PAGE - 1);
    /* advice only: memory the kernel will not give 2 MiB pages stays as it is */
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)size;
#endif
}

void lp_free(void *p) { free(p); }

int lp_map_file(const char *path, lp_mapped_file *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lp_error_set(err, LP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lp_fail(err, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lp_error_set(err, LP_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

/* Reads size bytes of fd into a fresh anonymous mapping whose start is 2
 * MiB aligned, asked for huge pages, then made read-only. */
static int read_into_huge(int fd, const char *path, size_t size, lp_mapped_file *out, lp_error *err) {
    size_t bytes;
    if (!lp_add_ok(size, HUGE_PAGE - 1, &bytes)) return lp_fail(err, "%s: file too large", path);
    bytes &= ~(HUGE_PAGE - 1);
    size_t span;
    if (!lp_add_ok(bytes, HUGE_PAGE, &span)) return lp_fail(err, "%s: file too large", path);
    uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return lp_error_set(err, LP_ERR_NOMEM, "%s: cannot allocate %zu bytes: %s", path, span,
                                               strerror(errno));
    /* trim the mapping to the aligned [p, p + bytes) */
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + span > p + bytes) munmap(p + bytes, (size_t)(raw + span - (p + bytes)));
    advise_huge(p, bytes);
    for (size_t done = 0; done < size;) {
        ssize_t got = pread(fd, p + done, size - done, (off_t)done);
        if (got <= 0) {
            int e = got < 0 ? errno : 0;
            munmap(p, bytes);
            return lp_error_set(err, LP_ERR_IO, "%s: read error: %s", path, e ? strerror(e) : "file shrank");
        }
        done += (size_t)got;
    }
    if (mprotect(p, bytes, PROT_READ) != 0) {
        int e = errno;
        munmap(p, bytes);
        return lp_error_set(err, LP_ERR_IO, "%s: cannot protect: %s", path, strerror(e));
    }
    out->data = p;
    out->size = size;
    out->anon_bytes = bytes;
    return 0;
}

void lp_mapped_file_evict(const lp_mapped_file *f, const void *p, size_t n) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    uintptr_t lo = (uintptr_t)f->data, hi = lo + f->size, a = (uintptr_t)p, b = a + n;
    if (f->anon_bytes || !f->data || a < lo || b > hi || b <= a) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) & ~(page - 1), b &= ~(page - 1);
    /* a private read-only file mapping: dropped pages come back from the file, never as zeros */
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
#else
    (void)f, (void)p, (void)n;
#endif
}

int lp_load_file_huge(const char *path, lp_mapped_file *out, lp_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < LP_HUGE_MIN ||
        !lp_huge_pages_available()) {
        if (fd >= 0) close(fd);
        return lp_map_file(path, out, err); /* which names any problem with the path */
    }
    int rc = read_into_huge(fd, path, (size_t)st.st_size, out, err);
    close(fd);
    return rc;
}

void lp_unmap_file(lp_mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->anon_bytes ? f->anon_bytes : f->size);
    memset(f, 0, sizeof *f);
}

int lp_read_file(const char *path, char **out, size_t *size, size_t max_size,
                 lp_error *err) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return lp_error_set(err, LP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return lp_error_set(err, LP_ERR_NOMEM, "%s: out of memory", path);
        }
        size_t got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
        if (len > max_size) {
            free(buf);
            fclose(fp);
            return lp_fail(err, "%s: file larger than %zu bytes", path, max_size);
        }
        if (got == 0) break;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    bool failed = ferror(fp);
    fclose(fp);
    if (failed) {
        free(buf);
        return lp_error_set(err, LP_ERR_IO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    if (size) *size = len;
    return 0;
}

/* ---- half floats -------------------------------------------------------- */

float lp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = { .u = bits };
    return v.f;
}

uint16_t lp_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t x = v.u, sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
    if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* overflow */
    if (absx < 0x38800000) { /* subnormal or zero in half */
        if (absx < 0x33000000) return (uint16_t)sign;
        uint32_t man = (absx & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(absx >> 23); /* 14..24 */
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absx >> 13) - (112u << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

uint16_t lp_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 64);
    uint32_t rounding = 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* ---- RNG: xoshiro256** seeded by splitmix64 ----------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void lp_rng_seed(lp_rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lp_rng_u64(lp_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float lp_rng_uniform(lp_rng *rng) {
    return (float)(lp_rng_u64(rng) >> 40) * (1.0f / 16777216.0f);
}

float lp_rng_normal(lp_rng *rng) {
    /* Box-Muller; u1 in (0, 1] so log is finite. */
    double u1 = ((double)(lp_rng_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(lp_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- time --------------------------------------------------------------- */

double lp_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

int lp_utf8_len(const uint8_t *s, size_t avail) {
    if (avail == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) { n = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { n = 4; cp = c & 0x07; }
    else return 0;
    if ((size_t)n > avail) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* reject overlong forms, surrogates and values past U+10FFFF */
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000))
        return 0;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

bool lp_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = lp_utf8_len(s + i, n - i);
        if (l == 0) return false;
        i += (size_t)l;
    }
    return true;
}
