/* bkspark bookie storage engine: reads (write cache or entry logs, direct I/O batching). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- reads */
/* verify one entry-log record: header h (LR_HDR bytes) and body as read from disk */
static int record_check(Engine *e, LogFile *lf, uint64_t ledger, const Loc *loc, const unsigned char *h,
                        const unsigned char *body)
{
    uint32_t crc = bks_crc32c(bks_crc32c(0, h + 8, 16), body, loc->len);
    if (get32(h) != 16 + loc->len || get32(h + 4) != crc || get64(h + 8) != ledger ||
        (int64_t)get64(h + 16) != loc->entry) {
        seterr(e, "entry %llu:%lld corrupt in entry log %x at offset %llu (checksum/header mismatch)",
               (unsigned long long)ledger, (long long)loc->entry, lf->id, (unsigned long long)loc->off);
        return E_IO;
    }
    return E_OK;
}

static int record_unreadable(Engine *e, LogFile *lf, uint64_t ledger, const Loc *loc)
{
    seterr(e, "entry %llu:%lld unreadable in entry log %x at offset %llu: %s", (unsigned long long)ledger,
           (long long)loc->entry, lf->id, (unsigned long long)loc->off, strerror(errno));
    return E_IO;
}

/* read one record from an entry log (through the page cache) and verify it; returns E_OK or E_IO */
int log_read(Engine *e, LogFile *lf, uint64_t ledger, const Loc *loc, unsigned char *out)
{
    unsigned char h[LR_HDR];
    if (read_full(lf->fd, h, LR_HDR, loc->off) < 0 || read_full(lf->fd, out, loc->len, loc->off + LR_HDR) < 0)
        return record_unreadable(e, lf, ledger, loc);
    return record_check(e, lf, ledger, loc, h, out);
}

/* Direct reads (see entrylog.c "entry logs and the page cache").  Each reading thread keeps one
 * aligned buffer for them (a fresh one per read would fault in every page); a span never
 * exceeds DIO_SPAN_MAX, a larger record is read through the cache. */
#define DIO_SPAN_MAX (4u << 20) /* and so the most a reading thread keeps */
#define DIO_GAP_MAX (256u << 10) /* records this far apart still share one read */

static pthread_key_t dio_key;
static pthread_once_t dio_once = PTHREAD_ONCE_INIT;
typedef struct {
    unsigned char *buf;
    size_t cap;
} DioBuf;

static void dio_free(void *p)
{
    DioBuf *b = p;
    free(b->buf);
    free(b);
}

static void dio_key_init(void) { pthread_key_create(&dio_key, dio_free); }

static unsigned char *dio_buf(size_t n)
{
    pthread_once(&dio_once, dio_key_init);
    DioBuf *b = pthread_getspecific(dio_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(dio_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->cap < n) {
        void *p;
        size_t cap = n < (1u << 20) ? (1u << 20) : n;
        if (posix_memalign(&p, DIO_ALIGN, cap) != 0)
            return NULL;
        free(b->buf);
        b->buf = p;
        b->cap = cap;
    }
    return b->buf;
}

static uint64_t dio_span(const Loc *first, const Loc *last)
{
    uint64_t a = first->off & ~(uint64_t)(DIO_ALIGN - 1);
    uint64_t end = last->off + LR_HDR + last->len;
    return ((end + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1)) - a;
}

void log_open_direct(Engine *e, LogFile *lf, const char *path)
{
    lf->dfd = e->page_cache ? -1 : open(path, O_RDONLY | O_DIRECT | O_CLOEXEC); /* EINVAL: fs without it */
}

/* Read n records of one entry log (ascending offsets, together within DIO_SPAN_MAX) with one
 * direct read, verify each and copy its body out.  Returns how many records from the first were
 * read and verified (n on success); -1 if the direct read is refused (alignment), so the caller
 * reads through the cache instead. */
static long log_read_direct(Engine *e, LogFile *lf, uint64_t ledger, const Loc *locs, RangeItem *out, size_t n)
{
    uint64_t a = locs[0].off & ~(uint64_t)(DIO_ALIGN - 1), span = dio_span(&locs[0], &locs[n - 1]);
    uint64_t need = locs[n - 1].off + LR_HDR + locs[n - 1].len - a;
    unsigned char *buf = dio_buf(span);
    if (!buf)
        return -1;
    uint64_t got = 0;
    while (got < need) {
        ssize_t r = pread(lf->dfd, buf + got, span - got, (off_t)(a + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EINVAL && got == 0)
                return -1;
            break;
        }
        if (r == 0) {
            errno = ENODATA;
            break;
        }
        got += (uint64_t)r;
    }
    for (size_t k = 0; k < n; k++) {
        const unsigned char *h = buf + (locs[k].off - a);
        if (locs[k].off + LR_HDR + locs[k].len - a > got) {
            record_unreadable(e, lf, ledger, &locs[k]);
            return (long)k;
        }
        if (record_check(e, lf, ledger, &locs[k], h, h + LR_HDR) != E_OK)
            return (long)k;
        memcpy(out[k].data, h + LR_HDR, locs[k].len);
    }
    return (long)n;
}

/* Read records [0, n) of a range (lfs[k]: the entry log of record k, NULL if it came from the write
 * cache) into out[k].data; neighbours in one log share a direct read.  Returns how many records
 * from the first were read and verified. */
static size_t read_records(Engine *e, uint64_t ledger, const Loc *locs, LogFile *const *lfs, RangeItem *out, size_t n)
{
    size_t k = 0;
    while (k < n) {
        LogFile *lf = lfs[k];
        if (!lf) {
            k++;
            continue;
        }
        size_t m = k + 1;
        if (lf->dfd >= 0 && dio_span(&locs[k], &locs[k]) <= DIO_SPAN_MAX) {
            while (m < n && lfs[m] == lf && locs[m].off > locs[m - 1].off &&
                   locs[m].off - (locs[m - 1].off + LR_HDR + locs[m - 1].len) <= DIO_GAP_MAX &&
                   dio_span(&locs[k], &locs[m]) <= DIO_SPAN_MAX)
                m++;
            long r = log_read_direct(e, lf, ledger, &locs[k], &out[k], m - k);
            if (r >= 0) {
                if ((size_t)r < m - k)
                    return k + (size_t)r;
                k = m;
                continue;
            }
        }
        for (; k < m; k++)
            if (log_read(e, lf, ledger, &locs[k], out[k].data) != E_OK)
                return k;
    }
    return n;
}

void log_unref(Engine *e, LogFile *lf)
{
    pthread_mutex_lock(&e->mu);
    if (--lf->refs == 0 && lf->dead)
        log_release(lf);
    pthread_mutex_unlock(&e->mu);
}

int eng_read_range(Engine *e, uint64_t ledger, int64_t first, int64_t last, int64_t step, uint64_t max_bytes,
                   unsigned char *buf, size_t bufcap, RangeItem **items, size_t *nitems)
{
    if (step < 1)
        step = 1;
    *items = NULL;
    *nitems = 0;
    pthread_mutex_lock(&e->mu);
    if (e->closed) {
        pthread_mutex_unlock(&e->mu);
        return E_CLOSED;
    }
    Ledger *l = eng_find(e, ledger);
    if (!l) {
        pthread_mutex_unlock(&e->mu);
        seterr(e, "no such ledger %llu", (unsigned long long)ledger);
        return E_NOLEDGER;
    }
    size_t i;
    if (first == -1) {
        if (l->n == 0) {
            pthread_mutex_unlock(&e->mu);
            seterr(e, "ledger %llu has no entries", (unsigned long long)ledger);
            return E_NOENTRY;
        }
        i = l->n - 1;
        first = l->locs[i].entry;
        if (last < first)
            last = first;
    } else {
        i = loc_lower(l, first);
        if (i >= l->n || l->locs[i].entry != first) {
            pthread_mutex_unlock(&e->mu);
            seterr(e, "no such entry %llu:%lld", (unsigned long long)ledger, (long long)first);
            return E_NOENTRY;
        }
    }
    size_t cap = 16, cnt = 0;
    RangeItem *it = malloc(cap * sizeof *it);
    Loc *locs = malloc(cap * sizeof *locs);
    LogFile **lfs = malloc(cap * sizeof *lfs);
    uint64_t bytes = 0;
    int rc = E_OK;
    if (!it || !locs || !lfs) {
        rc = E_IO;
        goto unlock_out;
    }
    for (int64_t want = first; want <= last; want += step) {
        while (i < l->n && l->locs[i].entry < want) /* strided: skip the entries between */
            i++;
        if (i >= l->n || l->locs[i].entry != want)
            break;
        Loc *lc = &l->locs[i++];
        if (cnt > 0 && bytes + lc->len > max_bytes)
            break;
        if (buf && bytes + lc->len > bufcap)
            break; /* the caller's buffer is full (none read if the first entry does not fit) */
        if (cnt == cap) {
            cap *= 2;
            RangeItem *a = realloc(it, cap * sizeof *it);
            if (a) it = a;
            Loc *b = realloc(locs, cap * sizeof *locs);
            if (b) locs = b;
            LogFile **c = realloc(lfs, cap * sizeof *lfs);
            if (c) lfs = c;
            if (!a || !b || !c) {
                rc = E_IO;
                break;
            }
        }
        unsigned char *d = buf ? buf + bytes : malloc(lc->len ? lc->len : 1);
        if (!d) {
            rc = E_IO;
            break;
        }
        locs[cnt] = *lc;
        lfs[cnt] = NULL;
        if (IS_CACHE(lc->where)) {
            memcpy(d, e->cache[lc->where - WHERE_CACHE0].buf + lc->off, lc->len);
        } else {
            LogFile *lf = log_find(e, lc->where);
            if (!lf) {
                if (!buf)
                    free(d);
                if (cnt == 0) {
                    seterr(e, "entry %llu:%lld indexed in missing entry log %x", (unsigned long long)ledger,
                           (long long)lc->entry, lc->where);
                    rc = E_IO;
                }
                break;
            }
            lf->refs++;
            lfs[cnt] = lf;
        }
        it[cnt].entry = lc->entry;
        it[cnt].data = d;
        it[cnt].len = lc->len;
        bytes += lc->len;
        cnt++;
    }
unlock_out:
    pthread_mutex_unlock(&e->mu);
    size_t good = cnt;
    if (rc == E_OK) {
        good = read_records(e, ledger, locs, lfs, it, cnt);
        if (good == 0 && cnt > 0)
            rc = E_IO;
    }
    for (size_t k = 0; k < cnt; k++)
        if (lfs[k])
            log_unref(e, lfs[k]);
    for (size_t k = good; k < cnt && !buf; k++)
        free(it[k].data);
    if (rc != E_OK) {
        for (size_t k = 0; k < good && !buf; k++)
            free(it[k].data);
        free(it);
        good = 0;
        it = NULL;
    }
    free(locs);
    free(lfs);
    *items = it;
    *nitems = good;
    return rc;
}

int eng_read(Engine *e, uint64_t ledger, int64_t entry, unsigned char **out, uint32_t *len, int64_t *eid)
{
    RangeItem *it;
    size_t n;
    int rc = eng_read_range(e, ledger, entry, entry, 1, 0, NULL, 0, &it, &n);
    if (rc != E_OK)
        return rc;
    *out = it[0].data;
    *len = it[0].len;
    *eid = it[0].entry;
    free(it);
    return E_OK;
}
