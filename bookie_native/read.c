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
 * exceeds DIO_SPAN_MAX, a larger record is read through the cache.
 *
 * Read-ahead.  A thread whose reads move forward through one entry log (the data port serves a
 * connection's requests on one thread: a task reading many small ledgers asks for records that
 * lie next to each other, a flush writes a ledger's records together) reads ahead of what it was
 * asked and serves the next reads from the buffer while they fall inside it (a read whose first
 * records it holds reads only the rest).  Forward: a read starting at or after the last one's
 * start, at most DIO_RA_MIN past its end.  The window starts at DIO_RA_MIN and doubles up to
 * DIO_RA_MAX while each one serves a read; one that served none stops it for a read (a thread
 * skipping through a log, or reading backwards, reads little more than it asks).  Only a read
 * of at most a quarter of the window reads ahead: a larger one is batch enough.  A read whose
 * window fails (a bad block past what was asked) reads only what was asked, again.  Without
 * read-ahead each small range cost one device read (2026-12-07: a task reading 3,000 ledgers of
 * 8 entries, E=3 Qw=2, spent ~0.3 ms of bookie CPU per ledger, ~0.07 ms with the entries in the
 * page cache).
 *
 * What the buffer holds is trusted only where it cannot have changed: an entry log is append-only
 * and its id is never reused while the engine is open (ids only grow; compaction writes new
 * logs), so bytes of log `log` of engine `serial` below the log's written size when they were
 * read (`size`, taken under mu with the locations: everything below it was written before) stay
 * what they were.  Each record is still verified (checksum, ledger, entry, length) as it is
 * served; one that does not verify there is read from the disk again. */
#define DIO_SPAN_MAX (4u << 20) /* and so the most a reading thread keeps */
#define DIO_GAP_MAX (256u << 10) /* records this far apart still share one read */
#define DIO_RA_MIN (64u << 10)   /* the first read-ahead window of a forward-moving thread */
#define DIO_RA_MAX (1u << 20)    /* ... and the largest */

static pthread_key_t dio_key;
static pthread_once_t dio_once = PTHREAD_ONCE_INIT;
typedef struct {
    unsigned char *buf;
    size_t cap;
    uint64_t serial;  /* buf[0, hi - lo) holds bytes [lo, hi) of entry log `log` of engine `serial` */
    uint32_t log;
    uint64_t lo, hi;
    uint64_t start, next; /* where this thread's last read of that log started, and ended */
    uint64_t window;  /* the read-ahead window of its last direct read (0: none) */
    int used;         /* ... and whether a read since was served from it */
} DioBuf;

static void dio_free(void *p)
{
    DioBuf *b = p;
    free(b->buf);
    free(b);
}

static void dio_key_init(void) { pthread_key_create(&dio_key, dio_free); }

/* this thread's buffer, with room for n bytes (what it held is forgotten if it had to grow) */
static DioBuf *dio_buf(size_t n)
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
        b->lo = b->hi = 0;
    }
    return b;
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

/* Verify records [0, n) whose bytes start at `base` (the file's byte `at`) and copy their bodies
 * out; how many from the first verified.  `quiet`: a record that does not verify sets no error
 * (the caller reads it again from the disk). */
static size_t serve_records(Engine *e, LogFile *lf, uint64_t ledger, const Loc *locs, RangeItem *out, size_t n,
                            const unsigned char *base, uint64_t at, int quiet)
{
    for (size_t k = 0; k < n; k++) {
        const unsigned char *h = base + (locs[k].off - at);
        if (quiet) {
            uint32_t crc = bks_crc32c(bks_crc32c(0, h + 8, 16), h + LR_HDR, locs[k].len);
            if (get32(h) != 16 + locs[k].len || get32(h + 4) != crc || get64(h + 8) != ledger ||
                (int64_t)get64(h + 16) != locs[k].entry)
                return k;
        } else if (record_check(e, lf, ledger, &locs[k], h, h + LR_HDR) != E_OK) {
            return k;
        }
        memcpy(out[k].data, h + LR_HDR, locs[k].len);
    }
    return n;
}

/* pread [a, a + span) of fd into buf until at least `need` bytes are in: how many were (fewer than
 * need: errno says why); -1 if the descriptor refuses the read (O_DIRECT alignment: EINVAL first) */
static long long dio_pread(int fd, unsigned char *buf, uint64_t a, uint64_t span, uint64_t need)
{
    uint64_t got = 0;
    while (got < need) {
        ssize_t r = pread(fd, buf + got, span - got, (off_t)(a + got));
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
    return (long long)got;
}

/* Read n records of one entry log (ascending offsets, together within DIO_SPAN_MAX; `size`: the
 * log's written size when their locations were taken) with one direct read -- or from this
 * thread's read-ahead when it holds them -- verify each and copy its body out.  Returns how many
 * records from the first were read and verified (n on success); -1 if the direct read is refused
 * (alignment), so the caller reads through the cache instead. */
static long log_read_direct(Engine *e, LogFile *lf, uint64_t size, uint64_t ledger, const Loc *locs, RangeItem *out,
                            size_t n)
{
    uint64_t s = locs[0].off, t = locs[n - 1].off + LR_HDR + locs[n - 1].len;
    DioBuf *b = dio_buf(dio_span(&locs[0], &locs[n - 1]));
    if (!b)
        return -1;
    int same = b->serial == e->serial && b->log == lf->id;
    /* forward: starts at or after where the last read started, at most DIO_RA_MIN past its end */
    int forward = same && s >= b->start && s <= b->next + DIO_RA_MIN;
    size_t held = 0; /* the records, from the first, that the read-ahead holds */
    while (same && held < n && locs[held].off >= b->lo && locs[held].off + LR_HDR + locs[held].len <= b->hi)
        held++;
    if (held && serve_records(e, lf, ledger, locs, out, held, b->buf, b->lo, 1) < held)
        held = 0; /* (only if the disk changed under the log: they are read again, and fail there) */
    b->start = s;
    b->next = t;
    if (held)
        b->used = 1;
    if (held == n) {
        __atomic_add_fetch(&e->st_ra_hits, 1, __ATOMIC_RELAXED);
        return (long)n;
    }
    locs += held; /* the rest is read from the disk */
    out += held;
    n -= held;
    uint64_t a = locs[0].off & ~(uint64_t)(DIO_ALIGN - 1), need = t - a;
    uint64_t asked = dio_span(&locs[0], &locs[n - 1]), span = asked;
    /* the window doubles while the last one served reads, starts at DIO_RA_MIN, and stops (for
     * one read) after one that served none */
    uint64_t window = !forward ? 0
                      : b->used ? (b->window * 2 < DIO_RA_MAX ? (b->window ? b->window * 2 : DIO_RA_MIN) : DIO_RA_MAX)
                      : b->window ? 0 : DIO_RA_MIN;
    if (window && need * 4 <= window && size > t) { /* read ahead (small reads only: a large one
        * is batch enough), up to what the log held when the locations were taken */
        uint64_t end = t + window < size ? t + window : size;
        end = (end + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1);
        if (end - a > span)
            span = end - a < b->cap ? end - a : b->cap;
    }
    b->lo = b->hi = 0;
    b->serial = e->serial;
    b->log = lf->id;
    b->window = window;
    b->used = 0;
    unsigned char *buf = b->buf;
    long long got = dio_pread(lf->dfd, buf, a, span, need);
    if (got >= 0 && (uint64_t)got < need && span > asked) {
        /* the window met an error (a bad block past what was asked?): read only what was asked */
        b->window = 0;
        span = asked;
        got = dio_pread(lf->dfd, buf, a, span, need);
    }
    if (got < 0)
        return -1; /* (the caller reads them all through the cache) */
    __atomic_add_fetch(&e->st_dio_reads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&e->st_dio_bytes, (uint64_t)got, __ATOMIC_RELAXED);
    if ((uint64_t)got > need && size > a) { /* keep what it read, below the written size */
        b->lo = a;
        b->hi = a + ((uint64_t)got < size - a ? (uint64_t)got : size - a);
    }
    size_t k = 0;
    while (k < n && locs[k].off + LR_HDR + locs[k].len - a <= (uint64_t)got)
        k++;
    size_t good = serve_records(e, lf, ledger, locs, out, k, buf, a, 0);
    if (good == k && k < n)
        record_unreadable(e, lf, ledger, &locs[k]);
    return (long)(held + good);
}

/* Read records [0, n) of a range (lfs[k]: the entry log of record k, NULL if it came from the write
 * cache) into out[k].data; neighbours in one log share a direct read.  Returns how many records
 * from the first were read and verified. */
static size_t read_records(Engine *e, uint64_t ledger, const Loc *locs, LogFile *const *lfs, const uint64_t *sizes,
                           RangeItem *out, size_t n)
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
            long r = log_read_direct(e, lf, sizes[k], ledger, &locs[k], &out[k], m - k);
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

/* the index's locations of a range, gathered outside mu (kv_scan_locs callback) */
typedef struct {
    Loc *v;
    size_t n, cap;
    int64_t first, step;
    uint64_t bytes, limit;
} Gather;

static int gather_loc(void *arg, const Loc *lc)
{
    Gather *g = arg;
    if ((lc->entry - g->first) % g->step)
        return 0;
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 64;
        Loc *p = realloc(g->v, nc * sizeof *p);
        if (!p)
            return 1; /* (fewer entries: the read returns a shorter range) */
        g->v = p;
        g->cap = nc;
    }
    g->v[g->n++] = *lc;
    g->bytes += lc->len;
    return g->bytes > g->limit; /* enough: cache entries can only add to what the read returns */
}

/* Reads.  1. Under mu: the ledger (from the cache or the index) and where its entries are: the
 * write cache holds the newest, the index (for this incarnation, unless a delete is pending) the
 * flushed ones up to flushed_last.  2. Without mu: the index's locations for the range (one
 * iterator).  3. Under mu again: entry by entry, the write cache's copy if it has one (copied out
 * now), else the index's (step 2's only while the ledger is still step 1's incarnation); an entry
 * found in neither though flushed_last covers it was moved by a flush between 2 and 3 (it writes
 * the index before it drops the cache location), and one in a log compaction has just removed was
 * moved by it (index first, log table after): both are looked up again.  4. Without mu: the entry-log reads (the logs are referenced, so compaction cannot close
 * them under the reader). */
int eng_read_range(Engine *e, uint64_t ledger, int64_t first, int64_t last, int64_t step, uint64_t max_bytes,
                   unsigned char *buf, size_t bufcap, RangeItem **items, size_t *nitems)
{
    if (step < 1)
        step = 1;
    *items = NULL;
    *nitems = 0;
    pthread_mutex_lock(&e->mu);
    Ledger *l;
    int rc = e->closed ? E_CLOSED : led_lookup_durable(e, ledger, &l);
    if (rc != E_OK) {
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    if (!l) {
        pthread_mutex_unlock(&e->mu);
        seterr(e, "no such ledger %llu", (unsigned long long)ledger);
        return E_NOLEDGER;
    }
    uint64_t inc = l->inc; /* the incarnation step 2's locations belong to */
    int64_t flast = l->purge ? -1 : l->flushed_last, clast = l->n ? l->locs[l->n - 1].entry : -1;
    if (first == -1) {
        first = clast > flast ? clast : flast;
        if (first < 0) {
            pthread_mutex_unlock(&e->mu);
            seterr(e, "ledger %llu has no entries", (unsigned long long)ledger);
            return E_NOENTRY;
        }
        if (last < first)
            last = first;
    }
    pthread_mutex_unlock(&e->mu);

    Gather g = {NULL, 0, 0, first, step, 0, buf ? (bufcap < max_bytes ? bufcap : max_bytes) : max_bytes};
    int r = 0;
    if (first <= flast && (first == last || first + step > last)) { /* one entry: a point lookup */
        g.v = malloc(sizeof *g.v);
        r = g.v ? kv_get_loc(e, ledger, first, g.v) : -1;
        g.n = r == 1;
    } else if (first <= flast) {
        r = kv_scan_locs(e, ledger, first, last < flast ? last : flast, gather_loc, &g);
    }
    if (r < 0) {
        free(g.v);
        return E_IO;
    }

    size_t cap = 16, cnt = 0, gi = 0, hint = 0;
    RangeItem *it = malloc(cap * sizeof *it);
    Loc *locs = malloc(cap * sizeof *locs);
    LogFile **lfs = malloc(cap * sizeof *lfs);
    uint64_t *sizes = malloc(cap * sizeof *sizes); /* lfs[k]'s written size, taken with its location */
    uint64_t bytes = 0;
    if (!it || !locs || !lfs || !sizes) {
        rc = E_IO;
        seterr(e, "out of memory reading ledger %llu", (unsigned long long)ledger);
    }
    pthread_mutex_lock(&e->mu);
    pause_point(e, "read-scanned"); /* (test hook) */
    l = NULL;
    if (rc == E_OK && !e->closed)
        rc = led_lookup_durable(e, ledger, &l);
    if (rc == E_OK && !l) {
        rc = E_NOLEDGER; /* deleted meanwhile */
        seterr(e, "no such ledger %llu", (unsigned long long)ledger);
    }
    /* Deleted and re-created since step 1 (a recovery write-back re-creates a ledger): the
     * locations of step 2 are the old incarnation's -- the index may still hold them, or hold
     * the new one's by now -- and are dropped, so a read never returns another incarnation's
     * bytes: this incarnation's entries are in the write cache, or looked up again in the index
     * below (under mu, where flushed_last and purge say what it holds of this incarnation). */
    if (rc == E_OK && l->inc != inc)
        g.n = 0;
    for (int64_t want = first; rc == E_OK && want <= last; want += step) {
        Loc here, *lc = loc_get_hint(l, want, &hint);
        LogFile *lf = NULL;
        if (lc && !IS_CACHE(lc->where) && !(lf = log_find(e, lc->where))) {
            /* (flushed, its index batch not written yet: the log is in the table until compacted,
             * and compaction does not take a log a running flush wrote) */
            seterr(e, "entry %llu:%lld in missing entry log %x", (unsigned long long)ledger, (long long)want,
                   lc->where);
            rc = E_IO;
            break;
        }
        if (!lc) {
            while (gi < g.n && g.v[gi].entry < want)
                gi++;
            int found = gi < g.n && g.v[gi].entry == want;
            if (found)
                here = g.v[gi];
            for (int tries = 0; tries < 3; tries++) {
                if (found && (lf = log_find(e, here.where)))
                    break;
                if (l->purge || want > l->flushed_last)
                    break;
                /* a flush or a compaction moved it since the scan: ask the index again */
                found = kv_get_loc(e, ledger, want, &here);
                if (found < 0) {
                    rc = E_IO;
                    break;
                }
            }
            if (rc != E_OK)
                break;
            if (!found) {
                if (cnt == 0) {
                    seterr(e, "no such entry %llu:%lld", (unsigned long long)ledger, (long long)want);
                    rc = E_NOENTRY;
                }
                break;
            }
            if (!lf) {
                if (cnt == 0) {
                    seterr(e, "entry %llu:%lld indexed in missing entry log %x", (unsigned long long)ledger,
                           (long long)want, here.where);
                    rc = E_IO;
                }
                break;
            }
            lc = &here;
        }
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
            uint64_t *z = realloc(sizes, cap * sizeof *sizes);
            if (z) sizes = z;
            if (!a || !b || !c || !z) {
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
            lf->refs++;
            lfs[cnt] = lf;
            sizes[cnt] = lf->size;
        }
        it[cnt].entry = lc->entry;
        it[cnt].data = d;
        it[cnt].len = lc->len;
        bytes += lc->len;
        cnt++;
    }
    if (rc == E_OK && e->closed)
        rc = E_CLOSED;
    pthread_mutex_unlock(&e->mu);
    free(g.v);
    size_t good = cnt;
    if (rc == E_OK) {
        good = read_records(e, ledger, locs, lfs, sizes, it, cnt);
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
    free(sizes);
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
