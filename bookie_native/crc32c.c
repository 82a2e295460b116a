/* CRC-32C: SSE4.2 crc32 instruction when the CPU has it, slice-by-8 tables otherwise. */
#include "crc32c.h"
#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
/* operators shifting a crc over LONG / SHORT zero bytes (3-stream hardware path) */
#define LONG 8192
#define SHORT 256
static uint32_t zeros_long[4][256], zeros_short[4][256];
#define NPOW 40
static uint32_t zeros_pow[NPOW][4][256]; /* shift over 2^k zero bytes */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        sq[n] = gf2_times(mat, mat[n]);
}

/* operator for len (a power of two) zero bytes, in even */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32], row = 1;
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    do {
        gf2_square(even, odd); /* first pass: one zero byte */
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void zeros_table(uint32_t z[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        z[0][n] = gf2_times(op, n);
        z[1][n] = gf2_times(op, n << 8);
        z[2][n] = gf2_times(op, n << 16);
        z[3][n] = gf2_times(op, n << 24);
    }
}

static inline uint32_t shift(uint32_t z[4][256], uint32_t crc)
{
    return z[0][crc & 0xff] ^ z[1][(crc >> 8) & 0xff] ^ z[2][(crc >> 16) & 0xff] ^ z[3][crc >> 24];
}
static int have_hw = -1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = table[0][n];
        for (int k = 1; k < 8; k++) {
            c = table[0][c & 0xff] ^ (c >> 8);
            table[k][n] = c;
        }
    }
    zeros_table(zeros_long, LONG);
    zeros_table(zeros_short, SHORT);
    {
        /* operator for 2^k zero bytes: square the one for 2^(k-1) */
        uint32_t op[32], sq[32];
        zeros_op(op, 1);
        for (int k = 0; k < NPOW; k++) {
            for (uint32_t n = 0; n < 256; n++) {
                zeros_pow[k][0][n] = gf2_times(op, n);
                zeros_pow[k][1][n] = gf2_times(op, n << 8);
                zeros_pow[k][2][n] = gf2_times(op, n << 16);
                zeros_pow[k][3][n] = gf2_times(op, n << 24);
            }
            gf2_square(sq, op);
            memcpy(op, sq, sizeof op);
        }
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    have_hw = 0;
#endif
}

uint32_t bks_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, init_tables);
    const unsigned char *p = buf;
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>
/* crc of as many 3 x `block` byte runs of *p as *len holds, as three interleaved streams;
 * advances *p and *len.  `zeros` shifts a crc over `block` zero bytes. */
__attribute__((target("sse4.2"))) static inline uint64_t crc_3streams(
    uint64_t c, const unsigned char **pp, size_t *lenp, size_t block, uint32_t zeros[4][256])
{
    const unsigned char *p = *pp;
    size_t len = *lenp;
    while (len >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + block;
        do {
            uint64_t a, b, d;
            memcpy(&a, p, 8); memcpy(&b, p + block, 8); memcpy(&d, p + 2 * block, 8);
            c = _mm_crc32_u64(c, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
            p += 8;
        } while (p < end);
        c = shift(zeros, (uint32_t)c) ^ (uint32_t)c1;
        c = shift(zeros, (uint32_t)c) ^ (uint32_t)c2;
        p += 2 * block;
        len -= 3 * block;
    }
    *pp = p;
    *lenp = len;
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint64_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    /* three independent streams (the crc32 instruction has a 3-cycle latency, 1-cycle
     * throughput), combined by shifting over the zero bytes of the following streams */
    c = crc_3streams(c, &p, &len, LONG, zeros_long);
    c = crc_3streams(c, &p, &len, SHORT, zeros_short);
    while (len >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8); memcpy(&b, p + 8, 8); memcpy(&d, p + 16, 8); memcpy(&e, p + 24, 8);
        c = _mm_crc32_u64(c, a);
        c = _mm_crc32_u64(c, b);
        c = _mm_crc32_u64(c, d);
        c = _mm_crc32_u64(c, e);
        p += 32;
        len -= 32;
    }
    while (len >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = _mm_crc32_u64(c, a);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t bks_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, init_tables);
#if defined(__x86_64__)
    if (have_hw)
        return crc_hw(crc, buf, len);
#endif
    return bks_crc32c_sw(crc, buf, len);
}

uint32_t bks_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    pthread_once(&once, init_tables);
    for (int k = 0; len_b && k < NPOW; k++, len_b >>= 1)
        if (len_b & 1)
            crc_a = shift(zeros_pow[k], crc_a);
    return crc_a ^ crc_b;
}

int bks_crc32c_hw(void)
{
    pthread_once(&once, init_tables);
    return have_hw;
}
