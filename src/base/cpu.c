/* Runtime CPU feature detection (cpuid + xgetbv on x86, hwcaps on Arm). */
#include "base.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

void lp_cpu_detect(lp_cpu_features *f) {
    memset(f, 0, sizeof *f);
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1;
    if (!osxsave) return;
    uint64_t xcr0 = read_xcr0();
    bool ymm_ok = (xcr0 & 6) == 6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = ymm_ok && ((b >> 5) & 1);
    f->fma = ymm_ok && fma;
    f->f16c = ymm_ok && f16c;
    f->avx512f = zmm_ok && ((b >> 16) & 1);
    f->avx512bw = zmm_ok && ((b >> 30) & 1);
    f->avx512vl = zmm_ok && ((b >> 31) & 1);
    f->avx512vnni = zmm_ok && ((c >> 11) & 1);
    f->avx512vbmi = zmm_ok && ((c >> 1) & 1);
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    (void)b1; (void)c1; (void)d1;
    f->avxvnni = ymm_ok && ((a1 >> 4) & 1);
    f->avx512bf16 = zmm_ok && ((a1 >> 5) & 1);
}
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
void lp_cpu_detect(lp_cpu_features *f) {
    memset(f, 0, sizeof *f);
    f->neon = true;
    unsigned long caps = getauxval(AT_HWCAP);
    f->dotprod = (caps & HWCAP_ASIMDDP) != 0;
    f->i8mm = (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
}
#else
void lp_cpu_detect(lp_cpu_features *f) { memset(f, 0, sizeof *f); }
#endif

void lp_cpu_describe(const lp_cpu_features *f, char *buf, size_t cap) {
    static const struct { size_t off; const char *name; } names[] = {
        {offsetof(lp_cpu_features, avx2), "avx2"},
        {offsetof(lp_cpu_features, fma), "fma"},
        {offsetof(lp_cpu_features, f16c), "f16c"},
        {offsetof(lp_cpu_features, avx512f), "avx512f"},
        {offsetof(lp_cpu_features, avx512bw), "avx512bw"},
        {offsetof(lp_cpu_features, avx512vl), "avx512vl"},
        {offsetof(lp_cpu_features, avx512vnni), "avx512vnni"},
        {offsetof(lp_cpu_features, avx512vbmi), "avx512vbmi"},
        {offsetof(lp_cpu_features, avx512bf16), "avx512bf16"},
        {offsetof(lp_cpu_features, avxvnni), "avxvnni"},
        {offsetof(lp_cpu_features, neon), "neon"},
        {offsetof(lp_cpu_features, dotprod), "dotprod"},
        {offsetof(lp_cpu_features, i8mm), "i8mm"},
    };
    size_t used = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!*((const bool *)((const char *)f + names[i].off))) continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? " " : "", names[i].name);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
    if (used == 0 && cap) snprintf(buf, cap, "none");
}
