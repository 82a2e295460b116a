/* CRC-32C (Castagnoli, reflected poly 0x82F63B78), as used by every on-disk checksum. */
#ifndef BKS_CRC32C_H
#define BKS_CRC32C_H
#include <stddef.h>
#include <stdint.h>

/* Extend `crc` (0 to start) with `len` bytes; standard CRC-32C (same as the `crc32c` pip package). */
uint32_t bks_crc32c(uint32_t crc, const void *buf, size_t len);
/* 1 when the SSE4.2 instruction path is in use, 0 for the slice-by-8 table path. */
int bks_crc32c_hw(void);
/* crc of A||B from crc(A), crc(B) and |B| (like zlib's crc32_combine), without touching the bytes:
 * popcount(len_b) table steps.  len_b < 2^40. */
uint32_t bks_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* Software-only path (for tests). */
uint32_t bks_crc32c_sw(uint32_t crc, const void *buf, size_t len);
#endif
