/* bkspark bookie storage engine: entry logs and their index files (creating, writing, writeback, pacing). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- entry logs */
void lpath(Engine *e, int dir, uint32_t id, const char *ext, char *out, size_t n)
{
    snprintf(out, n, "%s/%08x.%s", e->ledger_dirs[dir], id, ext);
}

int logs_insert(Engine *e, LogFile *lf)
{
    if (e->nlogs == e->logcap) {
        size_t nc = e->logcap ? e->logcap * 2 : 16;
        LogFile **p = realloc(e->logs, nc * sizeof *p);
        if (!p)
            return -1;
        e->logs = p;
        e->logcap = nc;
    }
    size_t i = e->nlogs;
    while (i > 0 && e->logs[i - 1]->id > lf->id) {
        e->logs[i] = e->logs[i - 1];
        i--;
    }
    e->logs[i] = lf;
    e->nlogs++;
    return 0;
}

void logs_remove(Engine *e, LogFile *lf)
{
    for (size_t i = 0; i < e->nlogs; i++) {
        if (e->logs[i] == lf) {
            memmove(&e->logs[i], &e->logs[i + 1], (e->nlogs - i - 1) * sizeof(LogFile *));
            e->nlogs--;
            return;
        }
    }
}

static void mk_header(unsigned char *h, size_t hl, const char *magic, uint32_t id)
{
    memset(h, 0, hl);
    memcpy(h, magic, 4);
    put32(h + 4, L_VERSION);
    put32(h + 8, id);
    put32(h + hl - 4, bks_crc32c(0, h, hl - 4));
}

int check_header(const unsigned char *h, size_t hl, const char *magic, uint32_t id)
{
    return memcmp(h, magic, 4) == 0 && get32(h + 4) == L_VERSION && get32(h + 8) == id &&
           get32(h + hl - 4) == bks_crc32c(0, h, hl - 4);
}

/* create a new entry log + index file (caller: mu NOT held); not yet in e->logs */
static LogFile *log_create(Engine *e, uint32_t id, int dir)
{
    char p[4200], q[4200];
    lpath(e, dir, id, "log", p, sizeof p);
    lpath(e, dir, id, "idx", q, sizeof q);
    LogFile *lf = calloc(1, sizeof *lf);
    if (!lf)
        return NULL;
    lf->id = id;
    lf->dir = dir;
    lf->dfd = -1;
    lf->fd = open(p, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, DATA_FILE_MODE);
    lf->idx_fd = open(q, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, DATA_FILE_MODE);
    unsigned char h[L_HDR];
    if (lf->fd < 0 || lf->idx_fd < 0) {
        int err = errno;
        seterr(e, "cannot create entry log %s: %s", p, strerror(err));
        ldir_fail(e, dir, err);
        goto fail;
    }
    mk_header(h, L_HDR, L_MAGIC, id);
    if (write_full(lf->fd, h, L_HDR, 0) < 0)
        goto fail_io;
    mk_header(h, I_HDR, I_MAGIC, id);
    if (write_full(lf->idx_fd, h, I_HDR, 0) < 0 || fsync(lf->fd) < 0 || fsync(lf->idx_fd) < 0 ||
        fsync_dir(e->ledger_dirs[dir]) < 0)
        goto fail_io;
    lf->size = L_HDR;
    lf->idx_size = I_HDR;
    log_open_direct(e, lf, p);
    return lf;
fail_io: {
    int err = errno;
    seterr(e, "cannot write entry log %s: %s", p, strerror(err));
    ldir_fail(e, dir, err);
}
fail:
    if (lf->fd >= 0)
        close(lf->fd);
    if (lf->idx_fd >= 0)
        close(lf->idx_fd);
    free(lf);
    return NULL;
}

static int witem_cmp(const void *a, const void *b)
{
    const WItem *x = a, *y = b;
    if (x->ledger != y->ledger)
        return x->ledger < y->ledger ? -1 : 1;
    if (x->entry != y->entry)
        return x->entry < y->entry ? -1 : 1;
    return 0;
}

/* Sort flush items by (ledger, entry).  Items come in write-cache (insertion) order, which is
 * usually a few long runs per ledger with increasing entry ids (one per add batch): sort the runs
 * and concatenate them when they do not overlap, else fall back to a full sort. */
typedef struct {
    uint64_t ledger;
    int64_t first, last;
    size_t start, len;
} Run;

static int run_cmp(const void *a, const void *b)
{
    const Run *x = a, *y = b;
    if (x->ledger != y->ledger)
        return x->ledger < y->ledger ? -1 : 1;
    return x->first < y->first ? -1 : x->first > y->first;
}

void sort_items(WItem *w, size_t n, WItem *o)
{
    if (n < 2)
        return;
    size_t nr = 1;
    for (size_t i = 1; i < n; i++)
        if (w[i].ledger != w[i - 1].ledger || w[i].entry <= w[i - 1].entry)
            nr++;
    if (nr == 1)
        return;
    Run *r = malloc(nr * sizeof *r);
    int ok = r && o && nr <= n / 4; /* runs of ~1 item: just sort */
    if (ok) {
        size_t k = 0;
        r[0] = (Run){w[0].ledger, w[0].entry, w[0].entry, 0, 1};
        for (size_t i = 1; i < n; i++) {
            if (w[i].ledger != w[i - 1].ledger || w[i].entry <= w[i - 1].entry) {
                k++;
                r[k] = (Run){w[i].ledger, w[i].entry, w[i].entry, i, 0};
            }
            r[k].last = w[i].entry;
            r[k].len++;
        }
        qsort(r, nr, sizeof *r, run_cmp);
        for (size_t j = 1; j < nr && ok; j++)
            if (r[j].ledger == r[j - 1].ledger && r[j].first <= r[j - 1].last)
                ok = 0; /* overlapping runs (re-written entries) */
    }
    if (ok) {
        size_t m = 0;
        for (size_t j = 0; j < nr; j++) {
            memcpy(&o[m], &w[r[j].start], r[j].len * sizeof *o);
            m += r[j].len;
        }
        memcpy(w, o, n * sizeof *w);
    } else {
        qsort(w, n, sizeof *w, witem_cmp);
    }
    free(r);
}

/* Write items into entry logs.  `*cur` is the log to append to (may be NULL or rolled);
 * new logs are created as needed and appended to `created`.  `arena`: every item's entry-log
 * record (header + body) is already laid out at src - LR_HDR (a write-cache half), so runs of
 * adjacent records are written straight from there with pwritev; else records are assembled in
 * a buffer.  `sync`: fdatasync each touched log, then append + fdatasync its index block (what
 * compaction needs before it rewrites ledgers.state).  Without `sync` (plain flushes, which do
 * not move the LastLogMark, so the journal still covers them) the writes are only pushed out
 * with sync_file_range(WRITE) and the log is marked unsynced: sync_dirty_logs() makes it durable
 * before any ledgers.state / lastMark is written.  Caller holds ckpt_mu (a flush, into e->wlog) or
 * compact_mu (compaction, into a log of its own), not mu. */
typedef struct {
    struct iovec v[IOV_MAX > 1024 ? 1024 : IOV_MAX];
    int n;
    uint64_t bytes, off; /* bytes gathered, file offset of the first */
} IoBatch;

static int iob_flush(IoBatch *b, int fd)
{
    int vi = 0;
    uint64_t off = b->off;
    while (vi < b->n) {
        ssize_t w = pwritev(fd, &b->v[vi], b->n - vi, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        off += (uint64_t)w;
        while (vi < b->n && (size_t)w >= b->v[vi].iov_len) {
            w -= (ssize_t)b->v[vi].iov_len;
            vi++;
        }
        if (vi < b->n && w > 0) {
            b->v[vi].iov_base = (char *)b->v[vi].iov_base + w;
            b->v[vi].iov_len -= (size_t)w;
        }
    }
    b->off = off;
    b->n = 0;
    b->bytes = 0;
    return 0;
}

/* Entry-log writes reach the disk in chunks of FLUSH_CHUNK, each written back before the next
 * is queued (sync_file_range WAIT_BEFORE|WRITE|WAIT_AFTER: pages on the disk, no durability
 * claim -- fdatasync still makes them durable before any mark moves).  The journal shares the
 * disk: a flush that queued its whole write at once (16-32 MiB) held every journal fdatasync,
 * and so every add acknowledgement, behind it for 10-50 ms (bench/client.py paced runs); with
 * chunks, a journal sync waits behind at most one.  A failure here IS the write error: Linux
 * reports a failed writeback once per descriptor, so this call consumes it and the later
 * fdatasync of the same descriptor returns 0 over the lost pages -- the caller fails the
 * directory (ldir_fail). */
#define FLUSH_CHUNK (1u << 20)

/* Entry logs and the page cache.  Unless Engine.page_cache is set, written-back chunks leave the
 * page cache and reads of flushed entries are O_DIRECT (log_read_direct).  A growing page cache
 * takes fresh pages, and on VMs whose free memory goes back to the host (virtio-balloon free page
 * reporting, as on the machine we measure on) each fresh page costs a host fault: writing a GB of
 * new entry log cost 2.4 ms of CPU per MB, against 0.3 ms when each chunk's pages are dropped once
 * written back and reused for the next (bench/client.py at 60k 1 KiB entries/s: the three
 * bookies' flush threads spent 0.34 of the 2 cores there).  Reading dropped data back through
 * the cache would pay the same fault per page (1.3-2 ms/MB); a direct read costs 0.07 ms/MB in
 * 1 MiB reads.  Compaction still reads through the cache (log_read): it is rare and reads
 * scattered small records. */

static int writeback(Engine *e, int fd, uint64_t *from, uint64_t to)
{
    if (to > *from) {
        if (sync_file_range(fd, (off_t)*from, (off_t)(to - *from),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) < 0 &&
            errno != ENOSYS && errno != EINVAL)
            return -1; /* (ENOSYS/EINVAL: not supported there; fdatasync still checks) */
        uint64_t a = *from & ~(uint64_t)(DIO_ALIGN - 1), b = to & ~(uint64_t)(DIO_ALIGN - 1);
        if (!e->page_cache && b > a) /* written back, so clean: out of the cache (the partial last page stays) */
            posix_fadvise(fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
    }
    *from = to;
    return 0;
}

/* Paced flushes.  Every bookie of an ensemble takes the same share of the adds, so their write
 * caches reach the flush threshold together: three bookies wrote their 16 MiB halves in the same
 * ~45 ms, the disk's queue filled, every journal fdatasync in that window took 2-5 ms instead of
 * 0.4, and adds acknowledged in it waited 15-50 ms (bench/client.py at half peak: one such
 * episode every 0.43 s, the flush period, made the p99).  A flush started by the fill threshold
 * therefore spreads its writes over half the time the half took to fill (at most a second):
 * the next threshold is one more half-fill away, so the flush still ends well before it.  Pacing
 * stops as soon as the active half reaches the threshold itself (adds would soon wait for the
 * flush) or an explicit checkpoint or close is waiting for it (ckpt_lock_now); the interval
 * checkpoint, explicit checkpoints, close and compaction never pace. */

static void pace_wait(Engine *e, Pace *p, uint64_t bytes)
{
    if (!p || !p->budget_ns)
        return;
    p->done += bytes;
    for (;;) {
        uint64_t due = p->t0 + (uint64_t)((double)p->budget_ns * (double)p->done / (double)p->total);
        uint64_t t = now_ns();
        if (due <= t)
            return;
        pthread_mutex_lock(&e->mu);
        int hurry = e->ckpt_waiting || at_flush_threshold(e);
        if (hurry)
            e->st_hurried_flushes++;
        else
            cond_wait_ns(&e->ckpt_cv, &e->mu, due - t > 5000000ull ? 5000000ull : due - t);
        pthread_mutex_unlock(&e->mu);
        if (hurry) {
            p->budget_ns = 0;
            return;
        }
    }
}

/* ---------------------------------------------------------------- disk errors (README "Disk errors") */
void ldir_fail(Engine *e, int dir, int err)
{
    /* a limit of the process, not the disk's: nothing was written, so nothing was lost (the
     * call just fails; the next flush or checkpoint tries again) */
    if (err == EMFILE || err == ENFILE || err == ENOMEM || err == EINTR || err == EAGAIN)
        return;
    pthread_mutex_lock(&e->mu);
    if (!e->ldir_err[dir]) {
        e->ldir_err[dir] = err ? err : EIO;
        e->st_bg_errors++;
    }
    pthread_mutex_unlock(&e->mu);
}

int ldir_check(Engine *e, const char *what)
{
    for (int d = 0; d < e->nldirs; d++)
        if (e->ldir_err[d]) {
            seterr(e, "ledger directory %s failed a write (%s): %s are disabled until the bookie restarts "
                   "(the journal keeps everything since the last checkpoint; a restart replays it)",
                   e->ledger_dirs[d], strerror(e->ldir_err[d]), what);
            return E_IO;
        }
    return E_OK;
}

/* A write, writeback or sync of entry log `lf` failed (errno): the error and its directory's
 * failure (ldir_fail: not for a process limit such as out of memory -- the flush is retried). */
static void log_write_failed(Engine *e, LogFile *lf, const char *what)
{
    int err = errno;
    seterr(e, "entry log %x in %s: %s failed: %s", lf->id, e->ledger_dirs[lf->dir], what, strerror(err));
    ldir_fail(e, lf->dir, err);
    errno = err;
}

int write_items(Engine *e, WItem *w, size_t n, LogFile **cur, LogFile ***created, size_t *ncreated, int arena,
                int sync, Pace *pace)
{
    size_t i = 0;
    int rc = E_OK;
    Buf b = {0}, ib = {0};
    IoBatch *iob = arena ? malloc(sizeof *iob) : NULL;
    if (arena && !iob)
        return E_IO;
    while (i < n && rc == E_OK) {
        LogFile *lf = *cur;
        if (!lf || lf->size >= e->entry_log_max) {
            if (lf && lf->prealloc > lf->size) { /* sealed: give back the unused reservation */
                if (ftruncate(lf->fd, (off_t)lf->size) == 0)
                    lf->prealloc = lf->size;
            }
            pthread_mutex_lock(&e->mu);
            uint32_t id = e->next_log_id++;
            int dir = e->next_log_dir;
            e->next_log_dir = (e->next_log_dir + 1) % e->nldirs;
            pthread_mutex_unlock(&e->mu);
            LogFile **grown = realloc(*created, (*ncreated + 1) * sizeof(LogFile *));
            if (!grown) {
                rc = E_IO;
                break;
            }
            *created = grown;
            lf = log_create(e, id, dir);
            if (!lf) {
                rc = E_IO;
                break;
            }
            pthread_mutex_lock(&e->mu);
            int inserted = logs_insert(e, lf);
            pthread_mutex_unlock(&e->mu);
            if (inserted < 0) { /* (a log the table does not hold would escape the syncs) */
                close(lf->fd);
                close(lf->idx_fd);
                if (lf->dfd >= 0)
                    close(lf->dfd);
                free(lf);
                seterr(e, "out of memory for the entry-log table");
                rc = E_IO;
                break;
            }
            (*created)[(*ncreated)++] = lf;
            *cur = lf;
        }
        /* reserve the blocks ahead (unwritten extents, size unchanged): page-cache writes into
         * them skip ext4's per-page delayed-allocation accounting, and writeback has nothing to
         * allocate.  Best effort. */
        if (!sync && lf->prealloc < lf->size + (32u << 20) && lf->prealloc < e->entry_log_max) {
            uint64_t from = lf->prealloc > lf->size ? lf->prealloc : lf->size;
            uint64_t to = from + (64u << 20);
            if (to > e->entry_log_max + (8u << 20))
                to = e->entry_log_max + (8u << 20);
            if (to > from && fallocate(lf->fd, FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(to - from)) == 0)
                lf->prealloc = to;
            else
                lf->prealloc = e->entry_log_max; /* not supported: stop trying */
        }
        /* fill this log up to its max size (at least one record) */
        uint64_t tw_start = now_ns();
        size_t start = i;
        uint64_t pos = lf->size, wb_from = pos;
        b.len = 0;
        ib.len = 8;
        if (iob) {
            iob->n = 0;
            iob->bytes = 0;
            iob->off = pos;
        }
        if (buf_reserve(&ib, 8) < 0) {
            rc = E_IO;
            break;
        }
        while (i < n && (i == start || pos < e->entry_log_max)) {
            WItem *x = &w[i];
            if (buf_reserve(&ib, IR_SIZE) < 0) {
                rc = E_IO;
                break;
            }
            if (iob) {
                unsigned char *rec = (unsigned char *)x->src - LR_HDR;
                struct iovec *last = iob->n ? &iob->v[iob->n - 1] : NULL;
                if (last && (unsigned char *)last->iov_base + last->iov_len == rec) {
                    last->iov_len += LR_HDR + x->len;
                } else {
                    if (iob->n == (int)(sizeof iob->v / sizeof iob->v[0]) && iob_flush(iob, lf->fd) < 0) {
                        rc = E_IO;
                        break;
                    }
                    iob->v[iob->n].iov_base = rec;
                    iob->v[iob->n].iov_len = LR_HDR + x->len;
                    iob->n++;
                }
                iob->bytes += LR_HDR + x->len;
            } else {
                if (buf_reserve(&b, LR_HDR + x->len) < 0) {
                    rc = E_IO;
                    break;
                }
                unsigned char *p = b.buf + b.len;
                put32(p, 16 + x->len);
                put32(p + 4, x->crc);
                put64(p + 8, x->ledger);
                put64(p + 16, (uint64_t)x->entry);
                memcpy(p + LR_HDR, x->src, x->len);
                b.len += LR_HDR + x->len;
            }
            x->where = lf->id;
            x->dst_off = pos;
            unsigned char *q = ib.buf + ib.len;
            put64(q, x->ledger);
            put64(q + 8, (uint64_t)x->entry);
            put64(q + 16, x->inc);
            put64(q + 24, pos);
            put32(q + 32, x->len);
            put32(q + 36, 0);
            ib.len += IR_SIZE;
            pos += LR_HDR + x->len;
            i++;
            if (iob && iob->bytes >= FLUSH_CHUNK) {
                uint64_t chunk = iob->bytes;
                if (iob_flush(iob, lf->fd) < 0 || writeback(e, lf->fd, &wb_from, pos) < 0) {
                    rc = E_IO;
                    break;
                }
                pace_wait(e, pace, chunk);
            } else if (!iob && b.len >= FLUSH_CHUNK) {
                if (write_full(lf->fd, b.buf, b.len, pos - b.len) < 0 || writeback(e, lf->fd, &wb_from, pos) < 0) {
                    rc = E_IO;
                    break;
                }
                b.len = 0;
            }
        }
        if (rc != E_OK) {
            log_write_failed(e, lf, "write");
            break;
        }
        if ((iob && iob->n && iob_flush(iob, lf->fd) < 0) ||
            (!iob && b.len && write_full(lf->fd, b.buf, b.len, pos - b.len) < 0) ||
            writeback(e, lf->fd, &wb_from, pos) < 0) {
            log_write_failed(e, lf, "write");
            rc = E_IO;
            break;
        }
        uint64_t tw1 = now_ns();
        TM_ADD(e, TM_F_WRITE, tw1 - tw_start);
        if (sync && fdatasync(lf->fd) < 0) {
            log_write_failed(e, lf, "fdatasync");
            rc = E_IO;
            break;
        }
        uint64_t tw2 = now_ns();
        TM_ADD(e, TM_F_LOGSYNC, tw2 - tw1);
        uint32_t cnt = (uint32_t)(i - start);
        put32(ib.buf, cnt);
        put32(ib.buf + 4, bks_crc32c(bks_crc32c(0, ib.buf, 4), ib.buf + 8, ib.len - 8));
        if (write_full(lf->idx_fd, ib.buf, ib.len, lf->idx_size) < 0 || (sync && fdatasync(lf->idx_fd) < 0)) {
            log_write_failed(e, lf, "index write");
            rc = E_IO;
            break;
        }
        TM_ADD(e, TM_F_IDX, now_ns() - tw2);
        pthread_mutex_lock(&e->mu);
        lf->total += pos - lf->size;
        lf->size = pos;
        lf->idx_size += ib.len;
        if (!sync)
            lf->unsynced = 1;
        pthread_mutex_unlock(&e->mu);
    }
    free(b.buf);
    free(ib.buf);
    free(iob);
    return rc;
}

/* fdatasync every entry log + index written by a flush since the last call.  Runs before any
 * ledgers.state / lastMark is written (write_state), so the sizes they record and the data below
 * the mark are durable.  A failure fails the log's directory (sticky, ldir_fail): pages that failed
 * to write may since have been marked clean, so no later fdatasync could prove them durable -- the
 * mark never moves again (the journal keeps covering the data; a restart replays it).  Caller
 * holds ckpt_mu, not mu. */
int sync_dirty_logs(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (ldir_check(e, "checkpoints") != E_OK) {
        pthread_mutex_unlock(&e->mu);
        return E_IO;
    }
    size_t n = 0;
    LogFile **v = malloc((e->nlogs ? e->nlogs : 1) * sizeof *v);
    if (!v) {
        pthread_mutex_unlock(&e->mu);
        return E_IO;
    }
    for (size_t k = 0; k < e->nlogs; k++)
        if (e->logs[k]->unsynced) {
            v[n++] = e->logs[k];
            e->logs[k]->refs++;
        }
    pthread_mutex_unlock(&e->mu);
    int rc = E_OK;
    for (size_t k = 0; k < n; k++) {
        LogFile *lf = v[k];
        if (rc == E_OK && (fdatasync(lf->fd) < 0 || fdatasync(lf->idx_fd) < 0)) {
            log_write_failed(e, lf, "fdatasync");
            rc = E_IO;
        } else if (rc == E_OK) {
            pthread_mutex_lock(&e->mu);
            lf->unsynced = 0;
            pthread_mutex_unlock(&e->mu);
        }
        log_unref(e, lf);
    }
    free(v);
    return rc;
}
