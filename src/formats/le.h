/* Little-endian field access for the binary formats we own (.lpa, .lpx):
 * byte-wise, so it is alignment-safe and independent of the host's order. */
#ifndef LP_LE_H
#define LP_LE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t lp_le_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t lp_le_get_u64(const uint8_t *p) {
    return (uint64_t)lp_le_get_u32(p) | (uint64_t)lp_le_get_u32(p + 4) << 32;
}
static inline float lp_le_get_f32(const uint8_t *p) {
    uint32_t u = lp_le_get_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void lp_le_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void lp_le_put_u64(uint8_t *p, uint64_t v) {
    lp_le_put_u32(p, (uint32_t)v);
    lp_le_put_u32(p + 4, (uint32_t)(v >> 32));
}
static inline void lp_le_put_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    lp_le_put_u32(p, u);
}

#endif
