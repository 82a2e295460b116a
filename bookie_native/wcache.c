/* bkspark bookie storage engine: the write cache (two halves of entry-log records awaiting a flush). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- write cache */
int cache_put(Cache *c, uint64_t ledger, uint64_t inc, int64_t entry, const unsigned char *body, uint32_t len,
              uint32_t lcrc, int grow, uint64_t *off)
{
    if (c->used + LR_HDR + len > c->cap) {
        if (!grow && c->used > 0)
            return 1; /* full */
        size_t nc = c->cap ? c->cap : (1 << 20);
        while (nc < c->used + LR_HDR + len)
            nc *= 2;
        unsigned char *p = realloc(c->buf, nc);
        if (!p)
            return -1;
        c->buf = p;
        c->cap = nc;
    }
    if (c->n == c->ncap) {
        size_t nc = c->ncap ? c->ncap * 2 : 1024;
        CEnt *p = realloc(c->ents, nc * sizeof *p);
        if (!p)
            return -1;
        c->ents = p;
        c->ncap = nc;
    }
    unsigned char *h = c->buf + c->used; /* the entry-log record, as a flush will write it */
    put32(h, 16 + len);
    put32(h + 4, lcrc);
    put64(h + 8, ledger);
    put64(h + 16, (uint64_t)entry);
    memcpy(h + LR_HDR, body, len);
    CEnt *ce = &c->ents[c->n++];
    ce->ledger = ledger;
    ce->inc = inc;
    ce->entry = entry;
    ce->off = c->used + LR_HDR;
    ce->len = len;
    ce->lcrc = lcrc;
    *off = ce->off;
    c->used += LR_HDR + len;
    return 0;
}

void cache_reset(Cache *c, size_t nominal)
{
    c->used = 0;
    c->n = 0;
    if (c->cap > nominal * 2 && nominal) { /* shrink after an oversized replay */
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
}

uint32_t log_crc(uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len)
{
    unsigned char h[16];
    put64(h, ledger);
    put64(h + 8, (uint64_t)entry);
    return bks_crc32c(bks_crc32c(0, h, 16), body, len);
}
