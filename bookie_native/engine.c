/* bkspark bookie storage engine (see engine.h for the threading model, README.md for formats). */
#define _GNU_SOURCE
#include "engine.h"
#include "crc32c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- formats */
#define J_MAGIC "BKSJ"
#define J_VERSION 1u
#define J_HDR 512u
#define JR_HDR 12u /* u32 len, u32 type, u32 crc */
#define JG_HDR 24u /* group: "BKSG", u32 len, u32 crc(records), u64 own file offset, u32 crc(file id, bytes 0..20) */
#define JF_SYNC 1u /* journal header flag: written with fdatasync per group */
#define J_SECTOR 512u /* the unit a torn write leaves unwritten (file-offset aligned) */
enum { JR_ADD = 1, JR_MKEY = 2, JR_FENCE = 3, JR_LAC = 4, JR_DELETE = 5 };

#define L_MAGIC "BKSL"
#define L_VERSION 1u
#define L_HDR 64u
#define DIO_ALIGN 4096u /* O_DIRECT offset, length and buffer alignment (>= any logical block size) */
#define LR_HDR 24u /* u32 len(=16+body), u32 crc, u64 ledger, i64 entry */

#define I_MAGIC "BKSI"
#define I_HDR 64u
#define IR_SIZE 40u /* u64 ledger, i64 entry, u64 inc, u64 off, u32 len, u32 zero */

#define S_MAGIC "BKSS"
#define S_VERSION 1u
#define M_MAGIC "BKSM"

#define JPREALLOC (16u << 20)
#define JZ_CHUNK (1u << 20)  /* journal zeroing: one O_DIRECT write + fdatasync (at most) */
#define JZ_AHEAD (32u << 20) /* ... keeps this much written ahead of the journal's end */
#define JZ_GAP (4u << 20)    /* ... starting no nearer the end than this (a group never waits) */
#define JZ_BULK (256u << 10) /* ... not while groups average this much: one block-map update per
                              * such group costs less than writing its bytes twice */

/* ---------------------------------------------------------------- helpers */
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

const char *const eng_tm_names[TM_N] = {"add_crc", "add_locked", "add_syncwait", "cache_wait", "j_groupwait",
                                        "j_crc", "j_write", "j_sync", "f_collect", "f_sort", "f_write",
                                        "f_logsync", "f_idx", "f_repoint", "f_state", "f_jwait",
                                        "j_roll", "f_defsync"};
#define TM_ADD(e, k, v) __atomic_fetch_add(&(e)->tm[k], (v), __ATOMIC_RELAXED)

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* error message of the last failed engine call on this thread (read by the binding) */
static __thread char tls_err[512];

const char *eng_errmsg(void) { return tls_err; }
void eng_errclear(void) { tls_err[0] = 0; }

static void seterr(Engine *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_err, sizeof tls_err, fmt, ap);
    va_end(ap);
    memcpy(e->errmsg, tls_err, sizeof e->errmsg); /* last error of any thread (background flush) */
}

static int buf_reserve(Buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    size_t nc = b->cap ? b->cap : (1 << 20);
    while (nc < b->len + extra)
        nc *= 2;
    unsigned char *p = realloc(b->buf, nc);
    if (!p)
        return -1;
    b->buf = p;
    b->cap = nc;
    return 0;
}

static int write_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t len, uint64_t off)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = ENODATA;
            return -1;
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

static int mkdirs(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* atomically replace dir/name with data: tmp + fsync + rename + fsync dir */
static int write_atomic(const char *dir, const char *name, const void *data, size_t len)
{
    char tmp[4200], dst[4200];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0)
        return -1;
    if (write_full(fd, data, len, 0) < 0 || fsync(fd) < 0) {
        int s = errno;
        close(fd);
        errno = s;
        return -1;
    }
    close(fd);
    if (rename(tmp, dst) < 0)
        return -1;
    return fsync_dir(dir);
}

/* ---------------------------------------------------------------- ledger map */
static size_t hslot(Engine *e, uint64_t id)
{
    uint64_t h = id * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (e->nbuckets - 1);
}

Ledger *eng_find(Engine *e, uint64_t id)
{
    for (Ledger *l = e->buckets[hslot(e, id)]; l; l = l->next)
        if (l->id == id)
            return l;
    return NULL;
}

static Ledger *ledger_create(Engine *e, uint64_t id, uint64_t inc)
{
    if (e->nledgers + 1 > e->nbuckets) {
        size_t nb = e->nbuckets * 2;
        Ledger **nbk = calloc(nb, sizeof *nbk);
        if (!nbk)
            return NULL;
        Ledger **old = e->buckets;
        size_t onb = e->nbuckets;
        e->buckets = nbk;
        e->nbuckets = nb;
        for (size_t i = 0; i < onb; i++) {
            Ledger *l = old[i];
            while (l) {
                Ledger *nx = l->next;
                size_t s = hslot(e, l->id);
                l->next = e->buckets[s];
                e->buckets[s] = l;
                l = nx;
            }
        }
        free(old);
    }
    Ledger *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->id = id;
    l->inc = inc;
    if (inc >= e->next_inc)
        e->next_inc = inc + 1;
    size_t s = hslot(e, id);
    l->next = e->buckets[s];
    e->buckets[s] = l;
    e->nledgers++;
    return l;
}

static LogFile *log_find(Engine *e, uint32_t id)
{
    size_t lo = 0, hi = e->nlogs;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (e->logs[m]->id < id)
            lo = m + 1;
        else
            hi = m;
    }
    if (lo < e->nlogs && e->logs[lo]->id == id)
        return e->logs[lo];
    return NULL;
}

static void log_release(LogFile *lf)
{
    if (lf->dfd >= 0)
        close(lf->dfd);
    if (lf->fd >= 0)
        close(lf->fd);
    if (lf->idx_fd >= 0)
        close(lf->idx_fd);
    free(lf);
}

static void ledger_free_locs(Engine *e, Ledger *l)
{
    for (size_t i = 0; i < l->n; i++) {
        if (!IS_CACHE(l->locs[i].where)) {
            LogFile *lf = log_find(e, l->locs[i].where);
            if (lf)
                lf->live -= LR_HDR + l->locs[i].len;
        }
    }
    free(l->locs);
    l->locs = NULL;
    l->n = l->cap = 0;
}

static void ledger_remove(Engine *e, uint64_t id)
{
    Ledger **pp = &e->buckets[hslot(e, id)];
    while (*pp) {
        if ((*pp)->id == id) {
            Ledger *l = *pp;
            *pp = l->next;
            ledger_free_locs(e, l);
            free(l->lac);
            free(l);
            e->nledgers--;
            return;
        }
        pp = &(*pp)->next;
    }
}

/* index of the first loc with entry >= id */
static size_t loc_lower(Ledger *l, int64_t id)
{
    if (l->n && l->locs[l->n - 1].entry < id)
        return l->n;
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (l->locs[m].entry < id)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

static Loc *loc_get(Ledger *l, int64_t id)
{
    size_t i = loc_lower(l, id);
    if (i < l->n && l->locs[i].entry == id)
        return &l->locs[i];
    return NULL;
}

/* loc_get with a cursor: consecutive lookups of increasing entries of one ledger are O(1) */
static Loc *loc_get_hint(Ledger *l, int64_t id, size_t *hint)
{
    size_t h = *hint;
    if (h < l->n && l->locs[h].entry == id) {
        *hint = h + 1;
        return &l->locs[h];
    }
    size_t i = loc_lower(l, id);
    if (i < l->n && l->locs[i].entry == id) {
        *hint = i + 1;
        return &l->locs[i];
    }
    return NULL;
}

/* set the location of an entry (insert or replace); keeps log live-byte accounting */
static int loc_set(Engine *e, Ledger *l, int64_t entry, uint32_t where, uint32_t len, uint64_t off)
{
    size_t i = loc_lower(l, entry);
    if (i < l->n && l->locs[i].entry == entry) {
        Loc *o = &l->locs[i];
        if (!IS_CACHE(o->where)) {
            LogFile *lf = log_find(e, o->where);
            if (lf)
                lf->live -= LR_HDR + o->len;
        }
    } else {
        if (l->n == l->cap) {
            size_t nc = l->cap ? l->cap * 2 : 16;
            Loc *p = realloc(l->locs, nc * sizeof *p);
            if (!p)
                return -1;
            l->locs = p;
            l->cap = nc;
        }
        if (i < l->n)
            memmove(&l->locs[i + 1], &l->locs[i], (l->n - i) * sizeof(Loc));
        l->n++;
    }
    Loc *o = &l->locs[i];
    o->entry = entry;
    o->where = where;
    o->len = len;
    o->off = off;
    if (!IS_CACHE(where)) {
        LogFile *lf = log_find(e, where);
        if (lf)
            lf->live += LR_HDR + len;
    }
    return 0;
}

/* ---------------------------------------------------------------- write cache */
static int cache_put(Cache *c, uint64_t ledger, uint64_t inc, int64_t entry, const unsigned char *body, uint32_t len,
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

static void cache_reset(Cache *c, size_t nominal)
{
    c->used = 0;
    c->n = 0;
    if (c->cap > nominal * 2 && nominal) { /* shrink after an oversized replay */
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
}

static uint32_t log_crc(uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len)
{
    unsigned char h[16];
    put64(h, ledger);
    put64(h + 8, (uint64_t)entry);
    return bks_crc32c(bks_crc32c(0, h, 16), body, len);
}

/* ---------------------------------------------------------------- journal */
static void jpath(Engine *e, uint64_t id, char *out, size_t n) { snprintf(out, n, "%s/%016llx.txn", e->journal_dir, (unsigned long long)id); }

/* Checksums of a journal record, derived from pcrc = crc32c(payload) without another pass over
 * it: *field = crc32c(len || type || payload) (the record's crc field) and *rec = crc32c of the
 * whole record as it sits in the group (len || type || field || payload), which the group crc is
 * combined from. */
static void jrec_crcs(uint32_t type, uint32_t plen, uint32_t pcrc, uint32_t *field, uint32_t *rec)
{
    unsigned char h[JR_HDR];
    put32(h, plen);
    put32(h + 4, type);
    *field = bks_crc32c_combine(bks_crc32c(0, h, 8), pcrc, plen);
    put32(h + 8, *field);
    *rec = bks_crc32c_combine(bks_crc32c(0, h, JR_HDR), pcrc, plen);
}

/* append a record to the pending buffer; caller holds mu.  have_crc: field/rec from jrec_crcs */
static int j_enqueue(Engine *e, uint32_t type, const unsigned char *hdr, size_t hlen, const unsigned char *body,
                     size_t blen, int have_crc, uint32_t field, uint32_t rec)
{
    size_t plen = hlen + blen;
    if (buf_reserve(&e->pending, JG_HDR + JR_HDR + plen) < 0)
        return -1;
    if (e->pending.len == 0) { /* room for the group header, filled by the committer */
        e->pending_since_ns = now_ns();
        e->pending.len = JG_HDR;
        e->j_enq += JG_HDR;
        e->pending_gcrc = 0; /* crc32c of the group's records so far (none) */
    }
    if (!have_crc) {
        uint32_t pcrc = bks_crc32c(0, hdr, hlen);
        if (blen)
            pcrc = bks_crc32c(pcrc, body, blen);
        jrec_crcs(type, (uint32_t)plen, pcrc, &field, &rec);
    }
    unsigned char *p = e->pending.buf + e->pending.len;
    put32(p, (uint32_t)plen);
    put32(p + 4, type);
    put32(p + 8, field);
    memcpy(p + JR_HDR, hdr, hlen);
    if (blen)
        memcpy(p + JR_HDR + hlen, body, blen);
    e->pending.len += JR_HDR + plen;
    e->j_enq += JR_HDR + plen;
    e->pending_gcrc = bks_crc32c_combine(e->pending_gcrc, rec, JR_HDR + plen);
    return 0;
}

static int j_enq_add(Engine *e, uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len, uint32_t field,
                     uint32_t rec)
{
    unsigned char h[16];
    put64(h, ledger);
    put64(h + 8, (uint64_t)entry);
    return j_enqueue(e, JR_ADD, h, 16, body, len, 1, field, rec);
}

static int j_enq_keyrec(Engine *e, uint32_t type, Ledger *l)
{
    unsigned char h[18 + MAX_KEY];
    put64(h, l->id);
    put64(h + 8, l->inc);
    uint16_t kl = l->keylen;
    memcpy(h + 16, &kl, 2);
    memcpy(h + 18, l->key, kl);
    return j_enqueue(e, type, h, 18 + (size_t)kl, NULL, 0, 0, 0, 0);
}

/* Create journal file `id`: its header durable, and its directory entry.  `prealloc` (not NULL):
 * reserve space with posix_fallocate (best effort; *prealloc = bytes reserved).  `whole_page`:
 * the header's page is written whole (zeros after the header), so a prepared file is written
 * from offset 0 on.  Needs no lock (the caller owns `id`).  Returns the descriptor, -1 (errno). */
static int j_create_file(Engine *e, uint64_t id, uint64_t *prealloc, int whole_page)
{
    char p[4200];
    jpath(e, id, p, sizeof p);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    unsigned char hdr[DIO_ALIGN];
    size_t hlen = whole_page ? DIO_ALIGN : J_HDR;
    memset(hdr, 0, hlen);
    memcpy(hdr, J_MAGIC, 4);
    put32(hdr + 4, J_VERSION);
    put64(hdr + 8, id);
    put32(hdr + 16, e->jsync ? JF_SYNC : 0);
    put32(hdr + 20, bks_crc32c(0, hdr, 20));
    if (prealloc) {
        uint64_t pre = JPREALLOC;
        if (pre > e->jmax_size + (1 << 20))
            pre = e->jmax_size + (1 << 20);
        if (posix_fallocate(fd, 0, (off_t)pre) != 0)
            pre = 0; /* best effort */
        *prealloc = pre;
    }
    if (write_full(fd, hdr, hlen, 0) < 0 || fdatasync(fd) < 0 || fsync_dir(e->journal_dir) < 0) {
        int s = errno;
        close(fd);
        errno = s;
        return -1;
    }
    return fd;
}

/* Make `fd` (journal file `id`, header written) the current journal (mu held, or before the
 * threads start): [0, zeroed) of it is already written, [0, reserved) allocated. */
static void j_use_file(Engine *e, int fd, uint64_t id, uint64_t reserved, uint64_t zeroed)
{
    if (e->jfd >= 0)
        close(e->jfd);
    e->jfd = fd;
    e->jpos = J_HDR;
    e->jprealloc = reserved;
    e->jdropped = 0;
    e->jcur_id = id;
    e->jz_lo = 0;
    e->jz_done = zeroed;
    e->jw_end = DIO_ALIGN; /* the header's page */
    if (e->zthread_started)
        pthread_cond_signal(&e->z_cv);
}

static int j_open_file(Engine *e, uint64_t id)
{
    uint64_t pre = 0;
    int fd = j_create_file(e, id, &pre, 0);
    if (fd < 0)
        return -1;
    j_use_file(e, fd, id, pre, 0);
    return 0;
}

/* Roll to the next journal file (mu held): the one the zeroer prepared if it is ready (a swap
 * of descriptors, no I/O under the lock), else created here (create, fallocate, two syncs). */
static int j_roll(Engine *e)
{
    while (e->jn_creating) /* the zeroer is creating it: never race it for the same name */
        pthread_cond_wait(&e->z_cv, &e->mu);
    if (e->jn_fd >= 0 && e->jn_id == e->jcur_id + 1) {
        j_use_file(e, e->jn_fd, e->jn_id, e->jn_done, e->jn_done);
        e->jn_fd = -1;
        e->st_jn_rolls++;
        return 0;
    }
    return j_open_file(e, e->jcur_id + 1);
}

/* Bytes of the next journal file the zeroer should have written by now: as much as the current
 * file has advanced into its last jz_ahead before the roll point (the same pace as the current
 * file's own zeroing, which has stopped by then), so the next file starts jz_ahead written. */
static uint64_t jn_target(const Engine *e)
{
    uint64_t left = e->jmax_size > e->jw_end ? e->jmax_size - e->jw_end : 0;
    return left >= e->jz_ahead ? DIO_ALIGN : e->jz_ahead - left;
}

/* Whether the zeroer has work the journal just made due (mu held): zeroing ahead in the current
 * file (once a half of jz_ahead was used up), the next file's creation (the journal is within
 * jz_ahead of its roll point), or zeroing the next file (a quarter of jz_ahead behind its pace)
 * -- a wake-up per such step, not per group. */
static int z_due(const Engine *e)
{
    int bulk = e->jg_avg >= JZ_BULK;
    if (!bulk && e->jz_done < e->jmax_size && e->jz_done < e->jw_end + e->jz_ahead / 2)
        return 1;
    if (e->jw_end + e->jz_ahead < e->jmax_size) /* far from the roll point */
        return 0;
    if (e->jn_fd < 0)
        return !e->jn_creating && now_ns() >= e->jn_retry_ns;
    return !bulk && e->jz_done >= e->jmax_size && e->jn_done + e->jz_ahead / 4 <= jn_target(e);
}

/* The journal is read only by replay: once synced, its pages leave the page cache, so the
 * next groups are copied into pages the kernel already has instead of growing the cache (on
 * the VMs we measure on, first-touch pages made journal writes cost 2 ms of CPU per MB, reused
 * ones 0.2 ms).  The partial last page stays: the next group writes into it. */
static void j_drop_synced(Engine *e, int fd, uint64_t end)
{
    uint64_t upto = end & ~(uint64_t)4095;
    if (upto >= e->jdropped + (1u << 20)) {
        posix_fadvise(fd, (off_t)e->jdropped, (off_t)(upto - e->jdropped), POSIX_FADV_DONTNEED);
        e->jdropped = upto;
    }
}

/* wait on cv (mu held) for at most d nanoseconds */
static void cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t d)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(d / 1000000000ull);
    ts.tv_nsec += (long)(d % 1000000000ull);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

/* One group commit (mu held on entry and return; released during the I/O): write every pending
 * record as one group, fdatasync it, then advance j_synced and wake the waiters.  Run by
 * whichever thread finds the journal idle with records pending: an add's own thread (j_wait), so
 * a lone writer pays no thread hand-off, or the journal thread, which drains at close.  j_busy
 * keeps commits one at a time and in sequence order, so durability and ordering do not depend on
 * who runs them.
 *
 * Group wait: until threshold bytes or the max wait since the oldest pending record -- but only
 * while some add_entries call is about to enqueue (adaptive: when nobody is, waiting cannot grow
 * the group, so commit at once, like a raw write+sync loop). */
static void j_commit(Engine *e)
{
    if (e->j_failed) { /* drop: waiters already failed */
        e->j_written = e->j_synced = e->j_enq;
        e->pending.len = 0;
        pthread_cond_broadcast(&e->synced_cv);
        return;
    }
    e->j_busy = 1;
    uint64_t tgw = now_ns();
    e->j_grouping = 1;
    while (!e->j_stop && e->group_wait_ns && e->pending.len < e->threshold && e->j_entering > 0) {
        uint64_t deadline = e->pending_since_ns + e->group_wait_ns;
        uint64_t t = now_ns();
        if (t >= deadline)
            break;
        cond_wait_ns(&e->gcv, &e->mu, deadline - t);
    }
    e->j_grouping = 0;
    TM_ADD(e, TM_J_GROUPWAIT, now_ns() - tgw);
    Buf tmp = e->writing;
    uint32_t gcrc = e->pending_gcrc;
    e->writing = e->pending;
    e->pending = tmp;
    e->pending.len = 0;
    uint64_t start = e->j_written, end = start + e->writing.len;
    int err = 0;
    if (e->jpos >= e->jmax_size) { /* roll */
        uint64_t tr = now_ns();
        int ro = j_roll(e);
        TM_ADD(e, TM_J_ROLL, now_ns() - tr);
        if (ro < 0) {
            err = errno;
        } else {
            if (e->njfiles == e->jfcap) {
                size_t nc = e->jfcap ? e->jfcap * 2 : 8;
                void *p = realloc(e->jfiles, nc * sizeof *e->jfiles);
                if (p) {
                    e->jfiles = p;
                    e->jfcap = nc;
                }
            }
            if (e->njfiles < e->jfcap) {
                e->jfiles[e->njfiles].id = e->jcur_id;
                e->jfiles[e->njfiles].start_seq = start;
                e->njfiles++;
            } else {
                err = ENOMEM; /* the group fails: the journal files' list cannot grow */
            }
        }
    }
    int fd = e->jfd;
    uint64_t pos = e->jpos, jid = e->jcur_id;
    /* the group is written up to its page's end (zeros after it, which the next group
     * overwrites): a write ending inside a page of a written block would read that page first */
    size_t wlen = e->writing.len, pad = (size_t)((DIO_ALIGN - ((pos + wlen) & (DIO_ALIGN - 1))) & (DIO_ALIGN - 1));
    if (e->writing.cap < wlen + pad && buf_reserve(&e->writing, pad) < 0)
        pad = 0;
    memset(e->writing.buf + wlen, 0, pad);
    wlen += pad;
    while (e->jz_to && e->jz_file == jid && pos + wlen > e->jz_from) /* never write where the zeroer does */
        pthread_cond_wait(&e->z_cv, &e->mu);
    int zeroed = pos >= e->jz_lo && pos + wlen <= e->jz_done;
    if (!zeroed)
        e->st_jz_behind++;
    e->jw_end = (pos + wlen + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1);
    e->jg_avg = e->jg_avg - (e->jg_avg >> 3) + (wlen >> 3);
    if (e->zthread_started && z_due(e))
        pthread_cond_signal(&e->z_cv);
    pthread_mutex_unlock(&e->mu);
    uint64_t t0 = now_ns();
    {
        unsigned char *g = e->writing.buf;
        unsigned char idb[8];
        memcpy(g, "BKSG", 4);
        put32(g + 4, (uint32_t)(e->writing.len - JG_HDR));
        put32(g + 8, gcrc); /* combined from the records' crcs as they were enqueued */
        put64(g + 12, pos); /* a copy of a group inside an entry body can't pass for a real one */
        put64(idb, jid);
        put32(g + 20, bks_crc32c(bks_crc32c(0, idb, 8), g, 20));
    }
    uint64_t tc = now_ns();
    TM_ADD(e, TM_J_CRC, tc - t0);
    if (!err && !zeroed && pos + wlen > e->jprealloc) { /* the zeroer is behind: reserve space */
        uint64_t grow = JPREALLOC > wlen ? JPREALLOC : wlen;
        if (posix_fallocate(fd, (off_t)e->jprealloc, (off_t)(pos + grow - e->jprealloc)) == 0)
            e->jprealloc = pos + grow;
    }
    if (!err && write_full(fd, e->writing.buf, wlen, pos) < 0)
        err = errno;
    uint64_t tw = now_ns();
    TM_ADD(e, TM_J_WRITE, tw - tc);
    if (!err && e->jsync && fdatasync(fd) < 0)
        err = errno;
    if (!err && e->jsync)
        j_drop_synced(e, fd, pos + e->writing.len);
    uint64_t t1 = now_ns();
    TM_ADD(e, TM_J_SYNC, t1 - tw);
    pthread_mutex_lock(&e->mu);
    if (err) {
        e->j_failed = err;
        seterr(e, "journal write/sync failed: %s", strerror(err));
    } else {
        e->jpos = pos + e->writing.len;
    }
    e->st_syncs++;
    e->st_sync_ns += t1 - t0;
    e->st_jbytes += e->writing.len;
    e->j_written = end;
    e->j_synced = end;
    e->j_busy = 0;
    pthread_cond_broadcast(&e->synced_cv);
    if (e->j_stop)
        pthread_cond_broadcast(&e->jcv); /* the journal thread drains what is left, then exits */
}

/* Commits what nobody waits for at close; otherwise the waiters commit their own records. */
static void *journal_thread(void *arg)
{
    Engine *e = arg;
    pthread_setname_np(pthread_self(), "bks-journal");
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->j_busy || (e->pending.len == 0 && !e->j_stop)) {
            pthread_cond_wait(&e->jcv, &e->mu);
            continue;
        }
        if (e->pending.len == 0)
            break; /* stopping, and nothing left */
        j_commit(e);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Journal zeroing.  A journal group lands in space posix_fallocate reserved, or past the end of
 * the file: either way its fdatasync must also make the file's block map durable (unwritten
 * extents converted, blocks allocated) -- on this machine's ext4 (no jbd2 journal) that is
 * extra synchronous metadata writes on every sync.  A 42 KiB group + fdatasync took 0.23-0.27 ms
 * and 90-104 us of CPU into fallocate'd space, against 0.11-0.13 ms and 50-60 us into blocks
 * already written (ad hoc, 3000 syncs each).  So this thread keeps the next JZ_AHEAD bytes of
 * the current journal file written with zeros: O_DIRECT chunks (no page cache), each made
 * durable by its own fdatasync so the journal's syncs find none of it to write, never nearer
 * than JZ_GAP to the journal's end (all three scaled down for small journal files, so tests
 * with 1 MiB journals zero too).  It costs a second stream of writes; measured with 3 bookies at
 * 45k paced 1 KiB adds/s (E3 Qw2 Qa2, three alternating pairs): the bookies' CPU per entry 13.6-
 * 13.9 us against 15.0-15.5 without, add p50 1.6-2.5 ms against 2.1-2.4, p99 about the same.
 * A group is written up to its page's end, so it never reads a page back from the disk.  Zeros
 * are what replay already stops at (as after fallocate), and what the sectors of a torn group
 * that its write never reached read as (j_torn_tail).  A group that would overlap the chunk
 * being zeroed waits for it (only when the journal outruns the zeroer); where the zeroer is
 * behind, the journal falls back to fallocate.  The zeroer stops for good when the directory
 * takes no O_DIRECT and pauses after other failures (disk full).
 *
 * Once the current file is zeroed to its roll point, the zeroer creates the next file (header
 * and directory entry durable) and zeroes its first jz_ahead bytes at the pace the current file
 * fills (jn_target), so the roll (j_roll) swaps descriptors instead of creating, fallocating and
 * syncing a file under mu -- with 512 MiB journals at 45k paced adds/s, the roll's 200-ms
 * window had entries over 10 ms in each of four 20-s runs (up to 5.6k entries, max 22.7 ms).
 * A prepared file never used is an empty journal: replay accepts it and the next start takes
 * the id after it.  While groups average JZ_BULK or more (jg_avg), nothing is zeroed (the next
 * file is still prepared): zeroing would double a bulk load's journal writes to save one
 * block-map update per megabyte-sized group. */
static void *jzero_thread(void *arg)
{
    Engine *e = arg;
    pthread_setname_np(pthread_self(), "bks-jzero");
    void *zb = NULL;
    if (posix_memalign(&zb, DIO_ALIGN, e->jz_chunk) != 0)
        return NULL;
    memset(zb, 0, e->jz_chunk);
    int fd = -1;
    uint64_t fid = 0;
    pthread_mutex_lock(&e->mu);
    while (!e->z_stop) {
        uint64_t near = e->jw_end + e->jz_gap, from = e->jz_done > near ? e->jz_done : near;
        uint64_t id = e->jcur_id;
        int bulk = e->jg_avg >= JZ_BULK; /* big groups: fallocate'd space costs them less */
        if (e->j_failed) {
            cond_wait_ns(&e->z_cv, &e->mu, 200000000ull);
            continue;
        }
        if (bulk || from >= e->jw_end + e->jz_ahead || from >= e->jmax_size + e->jz_chunk) {
            /* nothing to zero in this file now: the next file, once the roll is near */
            if (e->jw_end + e->jz_ahead < e->jmax_size) {
                cond_wait_ns(&e->z_cv, &e->mu, 200000000ull);
                continue;
            }
            if (e->jn_fd < 0) { /* create the next one: header and directory entry durable */
                uint64_t t = now_ns();
                if (t < e->jn_retry_ns) {
                    cond_wait_ns(&e->z_cv, &e->mu, e->jn_retry_ns - t);
                    continue;
                }
                uint64_t nid = e->jcur_id + 1;
                e->jn_creating = 1;
                pthread_mutex_unlock(&e->mu);
                int nfd = j_create_file(e, nid, NULL, 1);
                pthread_mutex_lock(&e->mu);
                e->jn_creating = 0;
                pthread_cond_broadcast(&e->z_cv); /* a roll waiting for it */
                if (nfd >= 0) {
                    e->jn_fd = nfd;
                    e->jn_id = nid;
                    e->jn_done = DIO_ALIGN;
                } else { /* (disk full...): the roll creates it itself; try again later */
                    e->jn_retry_ns = now_ns() + 1000000000ull;
                }
                continue;
            }
            if (bulk || e->jz_done < e->jmax_size || e->jn_done >= jn_target(e) ||
                e->jn_done >= e->jz_ahead) {
                cond_wait_ns(&e->z_cv, &e->mu, 200000000ull);
                continue;
            }
            id = e->jn_id;
            from = e->jn_done;
        }
        e->jz_file = id;
        e->jz_from = from;
        e->jz_to = from + e->jz_chunk;
        pthread_mutex_unlock(&e->mu);
        int unsupported = 0;
        if (fd >= 0 && fid != id) {
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            char p[4200];
            jpath(e, id, p, sizeof p);
            fd = open(p, O_WRONLY | O_DIRECT | O_CLOEXEC);
            fid = id;
            unsupported = fd < 0 && errno == EINVAL;
        }
        int ok = fd >= 0 && pwrite(fd, zb, e->jz_chunk, (off_t)from) == (ssize_t)e->jz_chunk && fdatasync(fd) == 0;
        pthread_mutex_lock(&e->mu);
        e->jz_to = 0;
        pthread_cond_broadcast(&e->z_cv); /* a group waiting for this chunk */
        if (ok && e->jcur_id == id) { /* the current file (perhaps the next one, rolled to meanwhile) */
            if (e->jz_done != from) /* the zeroed run starts over (a new file, or it fell behind) */
                e->jz_lo = from;
            e->jz_done = from + e->jz_chunk;
        } else if (ok && e->jn_fd >= 0 && e->jn_id == id) {
            e->jn_done = from + e->jz_chunk;
        }
        if (ok)
            e->st_jz_bytes += e->jz_chunk;
        if (unsupported)
            break;
        if (!ok)
            cond_wait_ns(&e->z_cv, &e->mu, 1000000000ull);
    }
    pthread_mutex_unlock(&e->mu);
    if (fd >= 0)
        close(fd);
    free(zb);
    return NULL;
}

/* wait (holding mu) until everything enqueued up to seq is durable, committing it on this
 * thread when no commit is running */
static int j_wait(Engine *e, uint64_t seq)
{
    e->j_waiters++;
    while (e->j_synced < seq && !e->j_failed) {
        if (!e->j_busy) {
            j_commit(e);
            continue;
        }
        if (e->j_grouping)
            pthread_cond_signal(&e->gcv); /* this entrant is done: the committer may stop waiting */
        pthread_cond_wait(&e->synced_cv, &e->mu);
    }
    e->j_waiters--;
    if (e->j_failed) {
        seterr(e, "journal failed: %s", strerror(e->j_failed));
        return E_IO;
    }
    return E_OK;
}

static void seq_to_mark(Engine *e, uint64_t seq, uint64_t *id, uint64_t *pos)
{
    for (size_t i = e->njfiles; i-- > 0;) {
        if (e->jfiles[i].start_seq <= seq) {
            *id = e->jfiles[i].id;
            *pos = J_HDR + (seq - e->jfiles[i].start_seq);
            return;
        }
    }
    *id = e->jfiles[0].id;
    *pos = J_HDR;
}

/* ---------------------------------------------------------------- add / fence / lac / delete */
static int key_eq(Ledger *l, const unsigned char *k, uint32_t kl) { return l->keylen == kl && memcmp(l->key, k, kl) == 0; }

/* The active half is filled to the flush threshold (half of it): the checkpoint thread flushes
 * the other half now, and a paced flush stops pacing (mu held). */
static inline int at_flush_threshold(const Engine *e)
{
    return e->cache[e->active].used >= e->cache_half / 2;
}

static void swap_for_flush(Engine *e)
{
    uint64_t t = now_ns();
    e->fill_ns = e->swap_ns ? t - e->swap_ns : 0;
    e->swap_ns = t;
    e->active ^= 1;
    e->flush_pending = 1;
    e->flush_mark_seq = e->j_enq;
    pthread_cond_signal(&e->ckpt_cv);
}

int eng_add_entries(Engine *e, AddReq *reqs, size_t n, int *status)
{
    pthread_mutex_lock(&e->mu);
    e->j_entering++;
    pthread_mutex_unlock(&e->mu);
    uint64_t ta = now_ns();
    for (size_t i = 0; i < n; i++) { /* checksums outside the lock */
        /* one pass over the body: the journal record's checksums derive from the entry-log one
         * (its payload, ledger || entry || body, is what log_crc covers) */
        reqs[i].lcrc = log_crc(reqs[i].ledger, reqs[i].entry, reqs[i].body, reqs[i].len);
        jrec_crcs(JR_ADD, 16 + reqs[i].len, reqs[i].lcrc, &reqs[i].jcrc, &reqs[i].rcrc);
    }
    uint64_t tb = now_ns();
    TM_ADD(e, TM_ADD_CRC, tb - ta);
    pthread_mutex_lock(&e->mu);
    uint64_t tl = now_ns(), tlw = 0;
    e->j_entering--;
    if (e->closed) {
        pthread_mutex_unlock(&e->mu);
        return E_CLOSED;
    }
    if (e->j_failed) {
        seterr(e, "journal failed: %s", strerror(e->j_failed));
        pthread_mutex_unlock(&e->mu);
        return E_IO;
    }
    int rc = E_OK;
    size_t i = 0;
    while (i < n) {
        AddReq *r = &reqs[i];
        Ledger *l = eng_find(e, r->ledger);
        if (l && l->has_key && !key_eq(l, r->key, r->keylen)) {
            status[i++] = BKS_EUA;
            continue;
        }
        if (l && l->fenced && !r->recovery) {
            status[i++] = BKS_EFENCED;
            continue;
        }
        Cache *c = &e->cache[e->active];
        if (c->used + LR_HDR + r->len > e->cache_half && c->used > 0) {
            if (!e->flush_pending) {
                swap_for_flush(e);
            } else {
                e->st_cache_waits++;
                pthread_cond_signal(&e->jcv);
                pthread_cond_signal(&e->ckpt_cv);
                if (e->flush_failed) {
                    char why[sizeof e->errmsg];
                    memcpy(why, e->errmsg, sizeof why);
                    seterr(e, "write cache full and its flush to the entry logs is failing: %s", why);
                    rc = E_IO;
                    break;
                }
                uint64_t tw0 = now_ns();
                pthread_cond_wait(&e->cache_cv, &e->mu);
                uint64_t tw1 = now_ns();
                tlw += tw1 - tw0;
                TM_ADD(e, TM_CACHE_WAIT, tw1 - tw0);
                if (e->closed || e->j_failed) {
                    rc = e->closed ? E_CLOSED : E_IO;
                    break;
                }
            }
            continue; /* re-check this entry: state may have changed while waiting */
        }
        if (!l) {
            l = ledger_create(e, r->ledger, e->next_inc);
            if (!l) {
                rc = E_IO;
                seterr(e, "out of memory");
                break;
            }
        }
        if (!l->has_key) {
            l->has_key = 1;
            l->keylen = (uint16_t)r->keylen;
            memcpy(l->key, r->key, r->keylen);
            if (j_enq_keyrec(e, JR_MKEY, l) < 0) {
                rc = E_IO;
                seterr(e, "out of memory");
                break;
            }
        }
        uint64_t off;
        if (cache_put(c, r->ledger, l->inc, r->entry, r->body, r->len, r->lcrc, 1, &off) < 0 ||
            loc_set(e, l, r->entry, WHERE_CACHE0 + (uint32_t)e->active, r->len, off) < 0 ||
            j_enq_add(e, r->ledger, r->entry, r->body, r->len, r->jcrc, r->rcrc) < 0) {
            rc = E_IO;
            seterr(e, "out of memory");
            break;
        }
        e->st_adds++;
        e->st_add_bytes += r->len;
        status[i++] = BKS_EOK;
    }
    if (at_flush_threshold(e) && !e->flush_pending) /* background flush at half */
        pthread_cond_signal(&e->ckpt_cv);
    uint64_t ts = now_ns();
    TM_ADD(e, TM_ADD_LOCKED, ts - tl - tlw);
    if (rc == E_OK)
        rc = j_wait(e, e->j_enq);
    TM_ADD(e, TM_ADD_SYNCWAIT, now_ns() - ts);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_fence(Engine *e, uint64_t ledger, const unsigned char *key, uint32_t keylen)
{
    pthread_mutex_lock(&e->mu);
    if (e->closed) {
        pthread_mutex_unlock(&e->mu);
        return E_CLOSED;
    }
    Ledger *l = eng_find(e, ledger);
    if (l && l->has_key && !key_eq(l, key, keylen)) {
        pthread_mutex_unlock(&e->mu);
        return E_UA;
    }
    int rc = E_OK;
    if (!l)
        l = ledger_create(e, ledger, e->next_inc);
    if (!l) {
        rc = E_IO;
    } else if (!l->fenced || !l->has_key) {
        if (!l->has_key) {
            l->has_key = 1;
            l->keylen = (uint16_t)keylen;
            memcpy(l->key, key, keylen);
        }
        l->fenced = 1;
        e->st_fences++;
        if (j_enq_keyrec(e, JR_FENCE, l) < 0)
            rc = E_IO;
    }
    if (rc == E_OK)
        rc = j_wait(e, e->j_enq);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_set_lac(Engine *e, uint64_t ledger, const unsigned char *lac, uint32_t len)
{
    pthread_mutex_lock(&e->mu);
    int rc = E_OK;
    Ledger *l = e->closed ? NULL : eng_find(e, ledger);
    if (e->closed)
        rc = E_CLOSED;
    else if (!l)
        rc = E_NOLEDGER;
    else {
        unsigned char *p = malloc(len ? len : 1);
        if (!p) {
            rc = E_IO;
        } else {
            memcpy(p, lac, len);
            free(l->lac);
            l->lac = p;
            l->laclen = len;
            l->has_lac = 1;
            unsigned char h[8];
            put64(h, ledger);
            if (j_enqueue(e, JR_LAC, h, 8, lac, len, 0, 0, 0) < 0)
                rc = E_IO;
            else
                rc = j_wait(e, e->j_enq);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_delete(Engine *e, uint64_t ledger)
{
    pthread_mutex_lock(&e->mu);
    int rc = E_OK;
    if (e->closed)
        rc = E_CLOSED;
    else if (eng_find(e, ledger)) {
        ledger_remove(e, ledger);
        unsigned char h[8];
        put64(h, ledger);
        if (j_enqueue(e, JR_DELETE, h, 8, NULL, 0, 0, 0, 0) < 0)
            rc = E_IO;
        else
            rc = j_wait(e, e->j_enq);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_force(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    int rc = e->closed ? E_CLOSED : j_wait(e, e->j_enq);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

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
static int log_read(Engine *e, LogFile *lf, uint64_t ledger, const Loc *loc, unsigned char *out)
{
    unsigned char h[LR_HDR];
    if (read_full(lf->fd, h, LR_HDR, loc->off) < 0 || read_full(lf->fd, out, loc->len, loc->off + LR_HDR) < 0)
        return record_unreadable(e, lf, ledger, loc);
    return record_check(e, lf, ledger, loc, h, out);
}

/* Direct reads (see "entry logs and the page cache" below).  Each reading thread keeps one
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

static void log_open_direct(Engine *e, LogFile *lf, const char *path)
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

static void log_unref(Engine *e, LogFile *lf)
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

/* ---------------------------------------------------------------- entry logs */
static void lpath(Engine *e, int dir, uint32_t id, const char *ext, char *out, size_t n)
{
    snprintf(out, n, "%s/%08x.%s", e->ledger_dirs[dir], id, ext);
}

static int logs_insert(Engine *e, LogFile *lf)
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

static void logs_remove(Engine *e, LogFile *lf)
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

static int check_header(const unsigned char *h, size_t hl, const char *magic, uint32_t id)
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
    lf->fd = open(p, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    lf->idx_fd = open(q, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    unsigned char h[L_HDR];
    if (lf->fd < 0 || lf->idx_fd < 0) {
        seterr(e, "cannot create entry log %s: %s", p, strerror(errno));
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
fail_io:
    seterr(e, "cannot write entry log %s: %s", p, strerror(errno));
fail:
    if (lf->fd >= 0)
        close(lf->fd);
    if (lf->idx_fd >= 0)
        close(lf->idx_fd);
    free(lf);
    return NULL;
}

typedef struct {
    uint64_t ledger, inc, off;
    int64_t entry;
    uint32_t len, crc;
    const unsigned char *src; /* body source (cache arena or read buffer) */
    uint32_t where;           /* destination log id after write */
    uint64_t dst_off;
    uint64_t cache_off;
} WItem;

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

static void sort_items(WItem *w, size_t n, WItem *o)
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
 * chunks, a journal sync waits behind at most one.  A failure here is not an error: fdatasync
 * reports it where durability is claimed. */
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

static void writeback(Engine *e, int fd, uint64_t *from, uint64_t to)
{
    if (to > *from) {
        sync_file_range(fd, (off_t)*from, (off_t)(to - *from),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        uint64_t a = *from & ~(uint64_t)(DIO_ALIGN - 1), b = to & ~(uint64_t)(DIO_ALIGN - 1);
        if (!e->page_cache && b > a) /* written back, so clean: out of the cache (the partial last page stays) */
            posix_fadvise(fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
    }
    *from = to;
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
typedef struct {
    uint64_t t0, budget_ns, total, done;
} Pace;

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

static int write_items(Engine *e, WItem *w, size_t n, LogFile **cur, LogFile ***created, size_t *ncreated, int arena,
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
            logs_insert(e, lf);
            pthread_mutex_unlock(&e->mu);
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
                if (iob_flush(iob, lf->fd) < 0) {
                    rc = E_IO;
                    break;
                }
                writeback(e, lf->fd, &wb_from, pos);
                pace_wait(e, pace, chunk);
            } else if (!iob && b.len >= FLUSH_CHUNK) {
                if (write_full(lf->fd, b.buf, b.len, pos - b.len) < 0) {
                    rc = E_IO;
                    break;
                }
                b.len = 0;
                writeback(e, lf->fd, &wb_from, pos);
            }
        }
        if (rc != E_OK) {
            seterr(e, "entry log %x write failed: %s", lf->id, strerror(errno));
            break;
        }
        if ((iob && iob->n && iob_flush(iob, lf->fd) < 0) ||
            (!iob && b.len && write_full(lf->fd, b.buf, b.len, pos - b.len) < 0)) {
            seterr(e, "entry log %x write failed: %s", lf->id, strerror(errno));
            rc = E_IO;
            break;
        }
        writeback(e, lf->fd, &wb_from, pos);
        uint64_t tw1 = now_ns();
        TM_ADD(e, TM_F_WRITE, tw1 - tw_start);
        if (sync && fdatasync(lf->fd) < 0) {
            seterr(e, "entry log %x write failed: %s", lf->id, strerror(errno));
            rc = E_IO;
            break;
        }
        uint64_t tw2 = now_ns();
        TM_ADD(e, TM_F_LOGSYNC, tw2 - tw1);
        uint32_t cnt = (uint32_t)(i - start);
        put32(ib.buf, cnt);
        put32(ib.buf + 4, bks_crc32c(bks_crc32c(0, ib.buf, 4), ib.buf + 8, ib.len - 8));
        if (write_full(lf->idx_fd, ib.buf, ib.len, lf->idx_size) < 0 || (sync && fdatasync(lf->idx_fd) < 0)) {
            seterr(e, "entry log index %x write failed: %s", lf->id, strerror(errno));
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
 * the mark are durable.  A failure is sticky: pages that failed to write may since have been
 * marked clean, so no later fdatasync could prove them durable -- the mark never moves again (the
 * journal keeps covering the data; a restart replays it).  Caller holds ckpt_mu, not mu. */
static int sync_dirty_logs(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->log_sync_failed) {
        int err = e->log_sync_failed;
        pthread_mutex_unlock(&e->mu);
        seterr(e, "an entry log fdatasync failed earlier (%s): checkpoints are disabled until restart", strerror(err));
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
            int err = errno;
            seterr(e, "entry log %x fdatasync failed: %s", lf->id, strerror(err));
            pthread_mutex_lock(&e->mu);
            e->log_sync_failed = err ? err : EIO;
            pthread_mutex_unlock(&e->mu);
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

/* ---------------------------------------------------------------- state file + lastmark */
static int serialize_state(Engine *e, Buf *b)
{
    /* caller holds mu */
    size_t need = 64 + e->nlogs * 20 + e->nledgers * (8 + 8 + 1 + 2 + 4);
    for (size_t s = 0; s < e->nbuckets; s++)
        for (Ledger *l = e->buckets[s]; l; l = l->next)
            need += l->keylen + (l->has_lac ? l->laclen : 0);
    b->len = 0;
    if (buf_reserve(b, need) < 0)
        return -1;
    unsigned char *p = b->buf;
    memcpy(p, S_MAGIC, 4);
    put32(p + 4, S_VERSION);
    put64(p + 8, e->next_inc);
    put32(p + 16, (uint32_t)e->nlogs);
    put64(p + 20, e->nledgers);
    p += 28;
    for (size_t i = 0; i < e->nlogs; i++) {
        put32(p, e->logs[i]->id);
        put64(p + 4, e->logs[i]->size);
        put64(p + 12, e->logs[i]->idx_size);
        p += 20;
    }
    for (size_t s = 0; s < e->nbuckets; s++) {
        for (Ledger *l = e->buckets[s]; l; l = l->next) {
            put64(p, l->id);
            put64(p + 8, l->inc);
            p[16] = (unsigned char)((l->has_key ? 1 : 0) | (l->fenced ? 2 : 0) | (l->has_lac ? 4 : 0));
            uint16_t kl = l->keylen;
            memcpy(p + 17, &kl, 2);
            memcpy(p + 19, l->key, kl);
            p += 19 + kl;
            uint32_t ll = l->has_lac ? l->laclen : 0;
            put32(p, ll);
            if (ll)
                memcpy(p + 4, l->lac, ll);
            p += 4 + ll;
        }
    }
    put32(p, bks_crc32c(0, b->buf, (size_t)(p - b->buf)));
    p += 4;
    b->len = (size_t)(p - b->buf);
    return 0;
}

static int write_state(Engine *e)
{
    uint64_t t0 = now_ns();
    int sr = sync_dirty_logs(e);
    TM_ADD(e, TM_F_DEFSYNC, now_ns() - t0);
    if (sr != E_OK)
        return sr;
    Buf b = {0};
    pthread_mutex_lock(&e->mu);
    int r = serialize_state(e, &b);
    pthread_mutex_unlock(&e->mu);
    if (r == 0)
        r = write_atomic(e->ledger_dirs[0], "ledgers.state", b.buf, b.len);
    if (r < 0)
        seterr(e, "cannot write ledger state file: %s", strerror(errno));
    free(b.buf);
    return r < 0 ? E_IO : E_OK;
}

static int write_lastmark(Engine *e, uint64_t id, uint64_t pos)
{
    unsigned char m[32];
    memset(m, 0, sizeof m);
    memcpy(m, M_MAGIC, 4);
    put32(m + 4, 1);
    put64(m + 8, id);
    put64(m + 16, pos);
    put32(m + 24, bks_crc32c(0, m, 24));
    for (int d = 0; d < e->nldirs; d++) {
        if (write_atomic(e->ledger_dirs[d], "lastMark", m, sizeof m) < 0) {
            seterr(e, "cannot write lastMark in %s: %s", e->ledger_dirs[d], strerror(errno));
            return E_IO;
        }
    }
    return E_OK;
}

static int u64cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* sorted journal ids in the journal dir */
static uint64_t *list_journals(Engine *e, size_t *n)
{
    *n = 0;
    DIR *d = opendir(e->journal_dir);
    if (!d)
        return NULL;
    size_t cap = 16;
    uint64_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        closedir(d);
        return NULL;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L != 20 || strcmp(de->d_name + 16, ".txn") != 0)
            continue;
        char *end;
        uint64_t id = strtoull(de->d_name, &end, 16);
        if (end != de->d_name + 16)
            continue;
        if (*n == cap) {
            uint64_t *p = realloc(ids, cap * 2 * sizeof *ids);
            if (!p) {
                free(ids);
                closedir(d);
                *n = 0;
                return NULL;
            }
            ids = p;
            cap *= 2;
        }
        ids[(*n)++] = id;
    }
    closedir(d);
    qsort(ids, *n, sizeof *ids, u64cmp);
    return ids;
}

/* Delete the journal files the LastLogMark no longer needs beyond max_backups (once per new
 * mark).  Runs without ckpt_mu: unlinking a 512 MiB file takes ~130 ms here, flushes need not wait. */
static void gc_journals(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    uint64_t mark_id = e->mark_id;
    int done = mark_id == e->jgc_mark;
    e->jgc_mark = mark_id;
    pthread_mutex_unlock(&e->mu);
    if (done)
        return;
    size_t n;
    uint64_t *ids = list_journals(e, &n);
    if (!ids)
        return;
    size_t older = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < mark_id)
            older++;
    size_t keep = (size_t)(e->max_backups > 0 ? e->max_backups : 0);
    for (size_t i = 0; i + keep < older; i++) {
        char p[4200];
        jpath(e, ids[i], p, sizeof p);
        unlink(p);
    }
    free(ids);
}

/* ---------------------------------------------------------------- checkpoint */
static int flush_cache_slot(Engine *e, int slot, uint64_t pace_budget_ns)
{
    Cache *c = &e->cache[slot];
    if (c->n > e->fw_cap) { /* scratch reused across flushes: no page faults on fresh memory */
        size_t nc = c->n + c->n / 4;
        free(e->fw);
        free(e->fw_tmp);
        e->fw = malloc(nc * sizeof(WItem));
        e->fw_tmp = malloc(nc * sizeof(WItem));
        e->fw_cap = e->fw && e->fw_tmp ? nc : 0;
        if (!e->fw_cap)
            return E_IO;
    }
    WItem *w = e->fw;
    /* collect live entries (those the index still points at) */
    pthread_mutex_lock(&e->mu);
    e->flushing = 1; /* until the re-point below: keeps compaction off the logs written here */
    e->flush_from_log = e->wlog ? e->wlog->id : e->next_log_id;
    uint64_t t0 = now_ns();
    size_t n = 0, hint = 0;
    Ledger *l = NULL;
    for (size_t i = 0; i < c->n; i++) {
        CEnt *ce = &c->ents[i];
        if (!l || l->id != ce->ledger) {
            l = eng_find(e, ce->ledger);
            hint = 0;
        }
        if (!l || l->inc != ce->inc)
            continue;
        Loc *lc = loc_get_hint(l, ce->entry, &hint);
        /* (offset, len) identifies the cache copy (every record in the arena has its own offset) */
        if (!lc || lc->where != WHERE_CACHE0 + (uint32_t)slot || lc->off != ce->off || lc->len != ce->len)
            continue;
        WItem *x = &w[n++];
        x->ledger = ce->ledger;
        x->inc = ce->inc;
        x->entry = ce->entry;
        x->len = ce->len;
        x->crc = ce->lcrc;
        x->src = c->buf + ce->off;
        x->cache_off = ce->off;
    }
    uint64_t t1 = now_ns();
    TM_ADD(e, TM_F_COLLECT, t1 - t0);
    pthread_mutex_unlock(&e->mu);
    sort_items(w, n, e->fw_tmp);
    TM_ADD(e, TM_F_SORT, now_ns() - t1);
    LogFile **created = NULL;
    size_t ncreated = 0;
    /* the half's record bytes: the live ones are written, dead ones only shorten the pacing */
    Pace pace = {now_ns(), c->used ? pace_budget_ns : 0, c->used, 0};
    int rc = n ? write_items(e, w, n, &e->wlog, &created, &ncreated, 1, 0, &pace) : E_OK;
    free(created);
    pthread_mutex_lock(&e->mu);
    uint64_t t2 = now_ns();
    if (rc == E_OK) {
        l = NULL;
        LogFile *lf = NULL;
        for (size_t i = 0; i < n; i++) {
            WItem *x = &w[i];
            if (!l || l->id != x->ledger) {
                l = eng_find(e, x->ledger);
                hint = 0;
            }
            if (!l || l->inc != x->inc)
                continue;
            Loc *lc = loc_get_hint(l, x->entry, &hint);
            if (lc && lc->where == WHERE_CACHE0 + (uint32_t)slot && lc->off == x->cache_off && lc->len == x->len) {
                /* what loc_set would do: the old place is the cache (no log to debit) */
                if (!lf || lf->id != x->where)
                    lf = log_find(e, x->where);
                lc->where = x->where;
                lc->off = x->dst_off;
                if (lf)
                    lf->live += LR_HDR + x->len;
            }
        }
    }
    e->flushing = 0;
    TM_ADD(e, TM_F_REPOINT, now_ns() - t2);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Flush the write cache (swap halves, write the swapped one to entry logs + index).  When `full`
 * (or a second has passed since the last full one) also persist the ledger state and move the
 * LastLogMark to the end of the flushed data, then delete old journals.  A flush without a new
 * mark is safe: the journal still covers the flushed data (and index bytes past the size recorded
 * in ledgers.state are treated as uncommitted).  Caller holds ckpt_mu, not mu. */
static int checkpoint_locked(Engine *e, int full, int paced)
{
    pthread_mutex_lock(&e->mu);
    if (e->j_failed) {
        pthread_mutex_unlock(&e->mu);
        seterr(e, "journal failed: %s", strerror(e->j_failed));
        return E_IO;
    }
    if (!e->flush_pending)
        swap_for_flush(e);
    uint64_t mark_seq = e->flush_mark_seq;
    int slot = !e->active;
    uint64_t budget = paced ? e->fill_ns / 2 : 0;
    if (budget > 1000000000ull)
        budget = 1000000000ull;
    if (budget)
        e->st_paced_flushes++;
    uint64_t tj = now_ns();
    int rc = j_wait(e, mark_seq);
    TM_ADD(e, TM_F_JWAIT, now_ns() - tj);
    pthread_mutex_unlock(&e->mu);
    if (rc != E_OK)
        return rc;
    rc = flush_cache_slot(e, slot, budget);
    if (rc != E_OK) {
        pthread_mutex_lock(&e->mu);
        e->flush_failed = 1;
        pthread_cond_broadcast(&e->cache_cv);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    e->flush_failed = 0;
    cache_reset(&e->cache[slot], e->cache_half);
    e->flush_pending = 0;
    e->flushed_seq = mark_seq;
    e->st_flushes++;
    pthread_cond_broadcast(&e->cache_cv);
    if (!full && now_ns() - e->last_full_ns < 1000000000ull) {
        pthread_mutex_unlock(&e->mu);
        return E_OK;
    }
    uint64_t mid, mpos;
    seq_to_mark(e, mark_seq, &mid, &mpos);
    pthread_mutex_unlock(&e->mu);
    uint64_t tst = now_ns();
    rc = write_state(e);
    if (rc != E_OK)
        return rc;
    rc = write_lastmark(e, mid, mpos);
    if (rc != E_OK)
        return rc;
    pthread_mutex_lock(&e->mu);
    e->mark_id = mid;
    e->mark_pos = mpos;
    e->st_checkpoints++;
    e->last_full_ns = now_ns();
    pthread_mutex_unlock(&e->mu);
    TM_ADD(e, TM_F_STATE, now_ns() - tst);
    return E_OK; /* the caller deletes the journals it freed (gc_journals), without ckpt_mu */
}

/* Take ckpt_mu without waiting out a paced flush's budget: the flush stops pacing. */
static void ckpt_lock_now(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->ckpt_waiting++;
    pthread_cond_broadcast(&e->ckpt_cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->ckpt_mu);
    pthread_mutex_lock(&e->mu);
    e->ckpt_waiting--;
    pthread_mutex_unlock(&e->mu);
}

int eng_checkpoint(Engine *e)
{
    ckpt_lock_now(e);
    int rc = e->closed ? E_CLOSED : checkpoint_locked(e, 1, 0);
    pthread_mutex_unlock(&e->ckpt_mu);
    if (rc == E_OK)
        gc_journals(e);
    return rc;
}

static void *ckpt_thread(void *arg)
{
    Engine *e = arg;
    pthread_setname_np(pthread_self(), "bks-ckpt");
    uint64_t last = now_ns();
    pthread_mutex_lock(&e->mu);
    while (!e->c_stop) {
        uint64_t t = now_ns();
        int due = t - last >= e->ckpt_interval_ns;
        int full = e->flush_pending || at_flush_threshold(e);
        if (!due && !full) {
            uint64_t d = e->ckpt_interval_ns - (t - last);
            if (d > 200000000ull)
                d = 200000000ull;
            cond_wait_ns(&e->ckpt_cv, &e->mu, d);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->ckpt_mu);
        pthread_mutex_lock(&e->mu);
        /* someone else may have checkpointed while we waited for ckpt_mu */
        int still = due || e->flush_pending || at_flush_threshold(e);
        pthread_mutex_unlock(&e->mu);
        int rc = (e->closed || !still) ? E_OK : checkpoint_locked(e, due, !due);
        pthread_mutex_unlock(&e->ckpt_mu);
        if (rc == E_OK)
            gc_journals(e);
        last = now_ns();
        pthread_mutex_lock(&e->mu);
        if (rc != E_OK) {
            e->st_bg_errors++;
            cond_wait_ns(&e->ckpt_cv, &e->mu, 1000000000ull); /* don't spin on a persistent failure */
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---------------------------------------------------------------- compaction */
typedef struct {
    LogFile *lf;
    double ratio;
} Cand;

static int cand_cmp(const void *a, const void *b)
{
    const Cand *x = a, *y = b;
    return x->ratio < y->ratio ? -1 : x->ratio > y->ratio;
}

/* Wait until `copied` bytes are due at the compaction rate (from t0), or close aborts the pass;
 * return nonzero if it does. */
static int compact_pace(Engine *e, uint64_t t0, uint64_t copied)
{
    pthread_mutex_lock(&e->mu);
    e->st_compact_copying = copied;
    if (e->compaction_rate) {
        uint64_t due = t0 + (uint64_t)((double)copied * 1e9 / (double)e->compaction_rate);
        for (uint64_t t = now_ns(); !e->closing && t < due; t = now_ns())
            cond_wait_ns(&e->compact_cv, &e->mu, due - t > 100000000ull ? 100000000ull : due - t);
    }
    int abort = e->closing;
    pthread_mutex_unlock(&e->mu);
    return abort;
}

/* One compaction pass (README "Compaction").  The copying holds neither mu nor ckpt_mu: flushes
 * go on beside it (a pass copying hundreds of MB under ckpt_mu stopped every flush, the write
 * cache filled and adds waited seconds), at most compaction_rate bytes/s so the journal's syncs
 * keep the disk.  It takes only sealed logs no flush is writing; its output is a log of its own,
 * synced chunk by chunk before the index points at it, so a checkpoint meanwhile may list it (a
 * restart adopts its copies, identical to the originals).  Re-pointing and writing the state take
 * ckpt_mu (one ledgers.state writer at a time); close aborts a pass at its next chunk. */
int eng_compact(Engine *e, CompactStats *cs)
{
    memset(cs, 0, sizeof *cs);
    pthread_mutex_lock(&e->compact_mu);
    pthread_mutex_lock(&e->mu);
    if (e->closing) { /* (set before closed) */
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_unlock(&e->compact_mu);
        return E_CLOSED;
    }
    Cand *cand = malloc((e->nlogs + 1) * sizeof *cand);
    if (!cand) {
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_unlock(&e->compact_mu);
        return E_IO;
    }
    size_t nc = 0;
    for (size_t i = 0; i < e->nlogs; i++) {
        LogFile *lf = e->logs[i];
        /* not the write log, nor one a running flush has written and not yet re-pointed */
        if (lf->dead || (e->flushing ? lf->id >= e->flush_from_log : lf == e->wlog))
            continue;
        cs->logs_examined++;
        uint64_t total = lf->size > L_HDR ? lf->size - L_HDR : 0;
        double ratio = total ? (double)lf->live / (double)total : 0.0;
        if (ratio < e->compaction_threshold || lf->live == 0) {
            cand[nc].lf = lf;
            cand[nc].ratio = lf->live == 0 ? -1.0 : ratio;
            nc++;
        }
    }
    qsort(cand, nc, sizeof *cand, cand_cmp);
    /* choose: all empty logs, plus partially live ones within the byte budget (at least one) */
    size_t nsel = 0;
    uint64_t budget = 0;
    for (size_t i = 0; i < nc; i++) {
        if (cand[i].lf->live == 0 || nsel == 0 || budget + cand[i].lf->live <= e->compaction_max_bytes) {
            budget += cand[i].lf->live;
            cand[nsel++] = cand[i];
        }
    }
    /* gather live entries of the selected logs from the index */
    for (size_t c = 0; c < nsel; c++)
        cand[c].lf->selected = 1;
    size_t wcap = 64, wn = 0;
    WItem *w = malloc(wcap * sizeof *w);
    LogFile **srcs = malloc(wcap * sizeof *srcs);
    int oom = !w || !srcs; /* nothing is moved yet: the run is given up */
    for (size_t s = 0; s < e->nbuckets && !oom; s++) {
        for (Ledger *l = e->buckets[s]; l && !oom; l = l->next) {
            for (size_t k = 0; k < l->n && !oom; k++) {
                Loc *lc = &l->locs[k];
                if (IS_CACHE(lc->where))
                    continue;
                LogFile *src = log_find(e, lc->where);
                if (!src || !src->selected)
                    continue;
                if (wn == wcap) {
                    WItem *nw = realloc(w, wcap * 2 * sizeof *w);
                    if (nw)
                        w = nw;
                    LogFile **ns = nw ? realloc(srcs, wcap * 2 * sizeof *srcs) : NULL;
                    if (ns)
                        srcs = ns;
                    if (!nw || !ns) {
                        oom = 1;
                        break;
                    }
                    wcap *= 2;
                }
                WItem *x = &w[wn];
                srcs[wn++] = src;
                memset(x, 0, sizeof *x);
                x->ledger = l->id;
                x->inc = l->inc;
                x->entry = lc->entry;
                x->len = lc->len;
                x->off = lc->off;
                x->cache_off = lc->where; /* source log id */
            }
        }
    }
    for (size_t c = 0; c < nsel; c++) {
        cand[c].lf->selected = 0;
        if (!oom)
            cand[c].lf->refs++;
    }
    pthread_mutex_unlock(&e->mu);
    if (oom) {
        free(srcs);
        free(w);
        free(cand);
        pthread_mutex_unlock(&e->compact_mu);
        return E_IO;
    }

    /* copy in chunks of <= 8 MiB: read + verify, write to the output log (synced per chunk).
     * A corrupt entry is not copied: its index record keeps pointing at the old log, which
     * therefore stays (the entry keeps reading as EIO, never as "no such entry"). */
    int rc = E_OK;
    uint64_t pace_t0 = now_ns(), pace_bytes = 0;
    LogFile *out = NULL;
    LogFile **created = NULL;
    size_t ncreated = 0;
    WItem *chunk = malloc((wn ? wn : 1) * sizeof *chunk);
    size_t *chunk_idx = malloc((wn ? wn : 1) * sizeof *chunk_idx);
    int *copied = calloc(wn ? wn : 1, sizeof *copied);
    size_t i = 0;
    while (i < wn && rc == E_OK) {
        size_t cn = 0;
        uint64_t cbytes = 0;
        for (; i < wn && (cn == 0 || cbytes + w[i].len <= (8u << 20)); i++) {
            WItem *x = &w[i];
            unsigned char *body = malloc(x->len ? x->len : 1);
            Loc lc = {x->entry, srcs[i]->id, x->len, x->off};
            if (!body || log_read(e, srcs[i], x->ledger, &lc, body) != E_OK) {
                cs->corrupt_entries++;
                free(body);
                continue;
            }
            x->crc = log_crc(x->ledger, x->entry, body, x->len);
            x->src = body;
            chunk[cn] = *x;
            chunk_idx[cn++] = i;
            cbytes += x->len;
        }
        if (cn)
            rc = write_items(e, chunk, cn, &out, &created, &ncreated, 0, 1, NULL);
        for (size_t k = 0; k < cn; k++) {
            w[chunk_idx[k]].where = chunk[k].where;
            w[chunk_idx[k]].dst_off = chunk[k].dst_off;
            copied[chunk_idx[k]] = rc == E_OK;
            free((void *)chunk[k].src);
        }
        pace_bytes += cbytes;
        if (rc == E_OK && compact_pace(e, pace_t0, pace_bytes))
            rc = E_CLOSED; /* closing: the copies stay unreferenced, the sources untouched */
    }
    free(chunk);
    free(chunk_idx);
    LogFile *victims[nsel ? nsel : 1];
    size_t nv = 0;
    pthread_mutex_lock(&e->ckpt_mu);
    pthread_mutex_lock(&e->mu);
    if (rc == E_OK) {
        for (size_t k = 0; k < wn; k++) {
            WItem *x = &w[k];
            if (!copied[k])
                continue;
            Ledger *l = eng_find(e, x->ledger);
            if (!l || l->inc != x->inc)
                continue;
            Loc *lc = loc_get(l, x->entry);
            if (lc && lc->where == (uint32_t)x->cache_off && lc->off == x->off) {
                loc_set(e, l, x->entry, x->where, x->len, x->dst_off);
                cs->entries_copied++;
                cs->bytes_copied += x->len;
            }
        }
        for (size_t c = 0; c < nsel; c++) {
            LogFile *lf = cand[c].lf;
            if (lf->live != 0)
                continue; /* something still points here (a corrupt entry) */
            victims[nv++] = lf;
            logs_remove(e, lf);
            lf->dead = 1;
        }
    }
    for (size_t c = 0; c < nsel; c++) {
        int victim = 0;
        for (size_t v = 0; v < nv; v++)
            if (victims[v] == cand[c].lf)
                victim = 1;
        if (!victim) /* victims keep our reference until their files are gone */
            cand[c].lf->refs--;
    }
    pthread_mutex_unlock(&e->mu);
    /* the new data and index are durable; persist the new log set, then remove old files */
    if (rc == E_OK && nv)
        rc = write_state(e);
    pthread_mutex_unlock(&e->ckpt_mu);
    if (rc == E_OK) {
        for (size_t v = 0; v < nv; v++) {
            char p[4200];
            lpath(e, victims[v]->dir, victims[v]->id, "log", p, sizeof p);
            unlink(p);
            lpath(e, victims[v]->dir, victims[v]->id, "idx", p, sizeof p);
            unlink(p);
            fsync_dir(e->ledger_dirs[victims[v]->dir]);
            cs->bytes_reclaimed += victims[v]->size;
            if (victims[v]->live == 0)
                cs->logs_deleted++;
            cs->logs_compacted++;
        }
    }
    pthread_mutex_lock(&e->mu);
    for (size_t v = 0; v < nv; v++)
        if (--victims[v]->refs == 0)
            log_release(victims[v]);
    e->st_compactions++;
    e->st_compacted_logs += cs->logs_compacted;
    e->st_compacted_bytes += cs->bytes_copied;
    e->st_compact_copying = 0;
    pthread_mutex_unlock(&e->mu);
    free(copied);
    free(srcs);
    free(created);
    free(w);
    free(cand);
    pthread_mutex_unlock(&e->compact_mu);
    return rc;
}

/* ---------------------------------------------------------------- open: state, logs, index, replay */
typedef struct {
    uint32_t id;
    uint64_t size, idx_size;
} Listed;

static int load_state(Engine *e, Listed **listed, size_t *nlisted, int *found)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/ledgers.state", e->ledger_dirs[0]);
    *found = 0;
    *listed = NULL;
    *nlisted = 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return E_OK;
        seterr(e, "cannot open %s: %s", p, strerror(errno));
        return E_IO;
    }
    struct stat st;
    fstat(fd, &st);
    size_t n = (size_t)st.st_size;
    unsigned char *b = malloc(n ? n : 1);
    if (!b || read_full(fd, b, n, 0) < 0) {
        close(fd);
        free(b);
        seterr(e, "cannot read %s", p);
        return E_IO;
    }
    close(fd);
    *found = 1;
    if (n < 32 || memcmp(b, S_MAGIC, 4) != 0 || get32(b + 4) != S_VERSION ||
        get32(b + n - 4) != bks_crc32c(0, b, n - 4)) {
        free(b);
        seterr(e, "ledger state file %s is corrupt (bad magic/version/checksum); refusing to start "
                  "without fencing state", p);
        return E_IO;
    }
    e->next_inc = get64(b + 8);
    uint32_t nl = get32(b + 16);
    uint64_t nled = get64(b + 20);
    const unsigned char *q = b + 28, *end = b + n - 4;
    if ((size_t)(end - q) < (size_t)nl * 20)
        goto bad;
    *listed = calloc(nl ? nl : 1, sizeof(Listed));
    for (uint32_t i = 0; i < nl; i++, q += 20) {
        (*listed)[i].id = get32(q);
        (*listed)[i].size = get64(q + 4);
        (*listed)[i].idx_size = get64(q + 12);
    }
    *nlisted = nl;
    for (uint64_t i = 0; i < nled; i++) {
        if (end - q < 19)
            goto bad;
        uint64_t id = get64(q), inc = get64(q + 8);
        unsigned flags = q[16];
        uint16_t kl;
        memcpy(&kl, q + 17, 2);
        if (kl > MAX_KEY || end - q < 19 + kl + 4)
            goto bad;
        Ledger *l = ledger_create(e, id, inc);
        l->has_key = flags & 1;
        l->fenced = (flags & 2) != 0;
        l->keylen = kl;
        memcpy(l->key, q + 19, kl);
        q += 19 + kl;
        uint32_t ll = get32(q);
        q += 4;
        if ((size_t)(end - q) < ll)
            goto bad;
        if (flags & 4) {
            l->has_lac = 1;
            l->lac = malloc(ll ? ll : 1);
            memcpy(l->lac, q, ll);
            l->laclen = ll;
        }
        q += ll;
    }
    if (q != end)
        goto bad; /* record count and size disagree */
    if (e->next_inc == 0)
        e->next_inc = 1;
    free(b);
    return E_OK;
bad:
    free(b);
    seterr(e, "ledger state file %s is malformed", p);
    return E_IO;
}

/* A log the ledger state does not list and whose header or index header is torn was being
 * created when the bookie died: log_create writes both headers before anything else goes in,
 * so it holds no entry, and the journal (not yet checkpointed past it) covers whatever was
 * meant for it.  Remove its files: adopting it would list an index that was never written,
 * and the next start would refuse it. */
static int discard_torn_log(Engine *e, const char *log_path, const char *idx_path)
{
    if ((unlink(log_path) < 0 && errno != ENOENT) || (unlink(idx_path) < 0 && errno != ENOENT)) {
        seterr(e, "cannot remove entry log %s, torn at creation: %s", log_path, strerror(errno));
        return E_IO;
    }
    return E_OK;
}

static int load_log(Engine *e, int dir, uint32_t id, const Listed *li)
{
    char p[4200], q[4200];
    lpath(e, dir, id, "log", p, sizeof p);
    lpath(e, dir, id, "idx", q, sizeof q);
    LogFile *lf = calloc(1, sizeof *lf);
    lf->id = id;
    lf->dir = dir;
    lf->dfd = -1;
    lf->fd = open(p, O_RDWR | O_CLOEXEC);
    lf->idx_fd = open(q, O_RDWR | O_CLOEXEC);
    unsigned char h[L_HDR];
    struct stat st;
    int ok = lf->fd >= 0 && read_full(lf->fd, h, L_HDR, 0) == 0 && check_header(h, L_HDR, L_MAGIC, id);
    if (!ok) {
        if (li) {
            seterr(e, "entry log %s is missing or has a corrupt header", p);
            log_release(lf);
            return E_IO;
        }
        log_release(lf); /* unlisted, torn at creation */
        return discard_torn_log(e, p, q);
    }
    fstat(lf->fd, &st);
    log_open_direct(e, lf, p);
    lf->size = (uint64_t)st.st_size;
    lf->total = lf->size - L_HDR;
    unsigned char *ib = NULL;
    size_t isz = 0;
    if (lf->idx_fd >= 0 && fstat(lf->idx_fd, &st) == 0) {
        isz = (size_t)st.st_size;
        ib = malloc(isz ? isz : 1);
        if (read_full(lf->idx_fd, ib, isz, 0) < 0)
            isz = 0;
    }
    uint64_t committed = li ? li->idx_size : 0;
    if (isz < I_HDR || !check_header(ib, I_HDR, I_MAGIC, id) || isz < committed) {
        if (li) {
            seterr(e, "entry log index %s is missing, truncated (%zu < %llu bytes) or has a corrupt header", q, isz,
                   (unsigned long long)committed);
            free(ib);
            log_release(lf);
            return E_IO;
        }
        free(ib);
        log_release(lf); /* unlisted, killed between the log's and the index's header */
        return discard_torn_log(e, p, q);
    }
    logs_insert(e, lf);
    size_t off = I_HDR;
    while (isz && off + 8 <= isz) {
        uint32_t cnt = get32(ib + off);
        size_t bl = (size_t)cnt * IR_SIZE;
        if (cnt == 0 || off + 8 + bl > isz ||
            get32(ib + off + 4) != bks_crc32c(bks_crc32c(0, ib + off, 4), ib + off + 8, bl)) {
            if (off < committed) {
                seterr(e, "entry log index %s corrupt at offset %zu (inside the checkpointed part)", q, off);
                free(ib);
                return E_IO;
            }
            break; /* torn tail of an unfinished checkpoint: the journal still covers it */
        }
        for (uint32_t k = 0; k < cnt; k++) {
            const unsigned char *r = ib + off + 8 + (size_t)k * IR_SIZE;
            Ledger *l = eng_find(e, get64(r));
            if (!l || l->inc != get64(r + 16))
                continue;
            loc_set(e, l, (int64_t)get64(r + 8), id, get32(r + 32), get64(r + 24));
        }
        off += 8 + bl;
    }
    lf->idx_size = off;
    free(ib);
    return E_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* An index whose log is gone (a kill between a removal's two unlinks) serves nothing: remove it,
 * or it would stay forever (only .log files are looked for) and a new log of its id could
 * meet it. */
static void drop_orphan_index(DIR *dd, const char *idx_name)
{
    char log_name[13];
    memcpy(log_name, idx_name, 8);
    strcpy(log_name + 8, ".log");
    if (faccessat(dirfd(dd), log_name, F_OK, 0) < 0 && errno == ENOENT)
        unlinkat(dirfd(dd), idx_name, 0);
}

static int load_logs(Engine *e, Listed *listed, size_t nlisted)
{
    /* (id, dir) of every *.log file */
    size_t cap = 64, n = 0;
    uint32_t *ids = malloc(cap * sizeof *ids * 2);
    if (!ids) {
        seterr(e, "out of memory listing entry logs");
        return E_IO;
    }
    for (int d = 0; d < e->nldirs; d++) {
        DIR *dd = opendir(e->ledger_dirs[d]);
        if (!dd)
            continue;
        struct dirent *de;
        while ((de = readdir(dd))) {
            if (strlen(de->d_name) != 12)
                continue;
            char *end;
            unsigned long id = strtoul(de->d_name, &end, 16);
            if (end != de->d_name + 8 || id == 0)
                continue;
            if (strcmp(de->d_name + 8, ".idx") == 0)
                drop_orphan_index(dd, de->d_name);
            if (strcmp(de->d_name + 8, ".log") != 0)
                continue;
            if (n == cap) {
                uint32_t *p = realloc(ids, cap * 2 * sizeof *ids * 2);
                if (!p) {
                    closedir(dd);
                    free(ids);
                    seterr(e, "out of memory listing entry logs");
                    return E_IO;
                }
                ids = p;
                cap *= 2;
            }
            ids[2 * n] = (uint32_t)id;
            ids[2 * n + 1] = (uint32_t)d;
            n++;
        }
        closedir(dd);
    }
    qsort(ids, n, sizeof *ids * 2, cmp_u32);
    uint32_t maxid = 0;
    for (size_t i = 0; i < nlisted; i++) {
        int present = 0;
        for (size_t k = 0; k < n; k++)
            if (ids[2 * k] == listed[i].id)
                present = 1;
        if (!present) {
            seterr(e, "entry log %08x.log is listed in the ledger state but missing from every ledger dir",
                   listed[i].id);
            free(ids);
            return E_IO;
        }
        if (listed[i].id > maxid)
            maxid = listed[i].id;
    }
    for (size_t k = 0; k < n; k++) {
        const Listed *li = NULL;
        for (size_t i = 0; i < nlisted; i++)
            if (listed[i].id == ids[2 * k])
                li = &listed[i];
        int rc = load_log(e, (int)ids[2 * k + 1], ids[2 * k], li);
        if (rc != E_OK) {
            free(ids);
            return rc;
        }
        if (ids[2 * k] > maxid)
            maxid = ids[2 * k];
    }
    e->next_log_id = maxid + 1;
    free(ids);
    return E_OK;
}

static void replay_record(Engine *e, uint32_t type, const unsigned char *p, uint32_t len)
{
    if (type == JR_ADD && len >= 16) {
        uint64_t lid = get64(p);
        int64_t entry = (int64_t)get64(p + 8);
        Ledger *l = eng_find(e, lid);
        if (!l)
            l = ledger_create(e, lid, e->next_inc);
        uint64_t off;
        uint32_t bl = len - 16;
        if (cache_put(&e->cache[e->active], lid, l->inc, entry, p + 16, bl, log_crc(lid, entry, p + 16, bl), 1,
                      &off) == 0)
            loc_set(e, l, entry, WHERE_CACHE0 + (uint32_t)e->active, bl, off);
    } else if ((type == JR_MKEY || type == JR_FENCE) && len >= 18) {
        uint64_t lid = get64(p), inc = get64(p + 8);
        uint16_t kl;
        memcpy(&kl, p + 16, 2);
        if (kl > MAX_KEY || 18u + kl > len)
            return;
        Ledger *l = eng_find(e, lid);
        if (!l)
            l = ledger_create(e, lid, inc);
        if (inc >= e->next_inc)
            e->next_inc = inc + 1;
        if (!l->has_key) {
            l->has_key = 1;
            l->keylen = kl;
            memcpy(l->key, p + 18, kl);
        }
        if (type == JR_FENCE)
            l->fenced = 1;
    } else if (type == JR_LAC && len >= 8) {
        Ledger *l = eng_find(e, get64(p));
        if (l) {
            free(l->lac);
            l->laclen = len - 8;
            l->lac = malloc(l->laclen ? l->laclen : 1);
            memcpy(l->lac, p + 8, l->laclen);
            l->has_lac = 1;
        }
    } else if (type == JR_DELETE && len >= 8) {
        ledger_remove(e, get64(p));
    }
}

/* is there a complete group with valid checksums at `off`? */
static int group_ok(const unsigned char *m, size_t off, size_t sz, uint64_t jid)
{
    unsigned char idb[8];
    put64(idb, jid);
    if (off + JG_HDR > sz || memcmp(m + off, "BKSG", 4) != 0 || get64(m + off + 12) != off ||
        get32(m + off + 20) != bks_crc32c(bks_crc32c(0, idb, 8), m + off, 20))
        return 0;
    uint32_t len = get32(m + off + 4);
    if (len < JR_HDR || off + JG_HDR + len > sz)
        return 0;
    return get32(m + off + 8) == bks_crc32c(0, m + off + JG_HDR, len);
}

/* offset of the next valid group at or after `off`, or sz */
static size_t next_group(const unsigned char *m, size_t off, size_t sz, uint64_t jid)
{
    while (off + JG_HDR <= sz) {
        const unsigned char *q = memchr(m + off, 'B', sz - off);
        if (!q)
            return sz;
        off = (size_t)(q - m);
        if (group_ok(m, off, sz, jid))
            return off;
        off++;
    }
    return sz;
}

/* Does [a, b) touch space a torn write did not reach?  A group is written where the file reads as
 * zeros (zeroed or fallocated ahead, or the padding after the previous group), so a sector the
 * write never reached still reads as zeros from `lo` (the group's start: bytes before it belong to
 * the previous, synced group) to its end; bytes past the end of the file were not reached either. */
static int j_unwritten(const unsigned char *m, size_t sz, size_t lo, uint64_t a, uint64_t b)
{
    if (b > sz)
        return 1;
    for (size_t s = (size_t)a & ~(size_t)(J_SECTOR - 1); s < b; s += J_SECTOR) {
        size_t i = s > lo ? s : lo, y = s + J_SECTOR < sz ? s + J_SECTOR : sz;
        while (i < y && m[i] == 0)
            i++;
        if (i == y)
            return 1;
    }
    return 0;
}

/* Could a crash have left the bytes at `off` (after the last valid group of a synced file, no
 * valid group after them)?  Each group is written only after the previous one was synced, so a
 * crash leaves at most the one group it interrupted, each of its sectors either written or still
 * zero.  Yes (1) when the group header is unwritten (that covers a tail of zeros), or when the
 * header is intact and every record failing its checksum touches an unwritten sector; no (0) when
 * written bytes fail a checksum: a header that is not a valid one, a bad record in written
 * sectors -- a fully written group that fails its checksum is corruption, not a tear.  *gend: the
 * group's end if its header is intact, else 0. */
static int j_torn_tail(const unsigned char *m, size_t off, size_t sz, uint64_t jid, uint64_t *gend)
{
    unsigned char idb[8];
    put64(idb, jid);
    *gend = 0;
    if (j_unwritten(m, sz, off, off, off + JG_HDR))
        return 1;
    if (memcmp(m + off, "BKSG", 4) != 0 || get64(m + off + 12) != off ||
        get32(m + off + 20) != bks_crc32c(bks_crc32c(0, idb, 8), m + off, 20))
        return 0;
    uint64_t end = (uint64_t)off + JG_HDR + get32(m + off + 4), r = off + JG_HDR;
    int torn = 0;
    *gend = end;
    while (r < end) {
        if (j_unwritten(m, sz, off, r, r + JR_HDR))
            return 1; /* the records from here on are unknown: the write never reached them */
        uint32_t len = get32(m + r), type = get32(m + r + 4);
        if (end - r < JR_HDR || len == 0 || len > end - r - JR_HDR || type < JR_ADD || type > JR_DELETE)
            return 0;
        uint64_t rend = r + JR_HDR + len;
        if (rend > sz)
            return 1;
        if (bks_crc32c(bks_crc32c(0, m + r, 8), m + r + JR_HDR, len) != get32(m + r + 8)) {
            if (!j_unwritten(m, sz, off, r, rend))
                return 0;
            torn = 1;
        }
        r = rend;
    }
    return torn; /* every record intact, yet the group checksum fails: not a tear */
}

static int replay_journals(Engine *e, int have_mark, uint64_t *maxid)
{
    size_t n;
    uint64_t *ids = list_journals(e, &n);
    if (!ids) { /* not "no journals": replaying nothing would lose acknowledged entries */
        seterr(e, "cannot list journal directory %s: %s", e->journal_dir, strerror(errno));
        return E_IO;
    }
    *maxid = e->mark_id;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = ids[i];
        if (id > *maxid)
            *maxid = id;
        if (have_mark && id < e->mark_id)
            continue;
        char p[4200];
        jpath(e, id, p, sizeof p);
        int fd = open(p, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        fstat(fd, &st);
        size_t sz = (size_t)st.st_size;
        if (sz < J_HDR) {
            e->st_replay_truncated += sz;
            close(fd);
            continue;
        }
        unsigned char *m = mmap(NULL, sz, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            free(ids);
            seterr(e, "cannot map journal %s: %s", p, strerror(errno));
            return E_IO;
        }
        if (memcmp(m, J_MAGIC, 4) != 0 || get32(m + 4) != J_VERSION || get64(m + 8) != id ||
            get32(m + 20) != bks_crc32c(0, m, 20)) {
            /* Header never made durable: nothing in it was acknowledged -- unless the file holds
             * a valid group (its header checksum covers the file id, known from the name): groups
             * are written only once the header is synced, so that header was damaged later. */
            uint64_t mark = have_mark && id == e->mark_id ? e->mark_pos : J_HDR;
            for (size_t k = next_group(m, J_HDR, sz, id); k < sz;) {
                size_t gend = k + JG_HDR + get32(m + k + 4);
                if (gend > mark) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s has a corrupt header but holds a valid group at offset %zu: acknowledged "
                              "records would be lost; refusing to start (restore the journal, or decommission "
                              "this bookie so that its ledgers are re-replicated)", p, k);
                    return E_IO;
                }
                k = next_group(m, gend, sz, id);
            }
            munmap(m, sz);
            close(fd);
            e->st_replay_truncated += sz;
            continue;
        }
        int synced_file = (get32(m + 16) & JF_SYNC) != 0;
        /* records before `mark` are already in the entry logs (`from`: the same within the file) */
        uint64_t mark = have_mark && id == e->mark_id ? e->mark_pos : J_HDR;
        size_t from = mark < sz ? (size_t)mark : sz;
        /* Walk the groups from the start (the mark may fall inside a group). Groups are
         * self-delimiting (magic + checksums), so after a bad spot we look for the next valid
         * group. Each group is written only after the previous one was fdatasync'ed, so in a
         * synced journal a valid group *after* a bad spot means synced data was damaged: if the
         * damage reaches past the LastLogMark, acknowledged records would be lost -- refuse to
         * start. A bad spot with no valid group after it is the preallocated zeros or the group a
         * crash tore (never acknowledged): cut it. But a last group whose written bytes fail a
         * checksum is damage, not a tear (j_torn_tail): its records were acknowledged and exist
         * nowhere else, so unless the mark has passed it, refuse to start. */
        size_t off = J_HDR, end = J_HDR;
        while (off < sz) {
            if (!group_ok(m, off, sz, id)) {
                size_t k = next_group(m, off + 1, sz, id);
                if (k >= sz && synced_file) {
                    uint64_t gend;
                    int torn = j_torn_tail(m, off, sz, id, &gend);
                    if (!torn || mark > off) { /* a group the mark has passed into was synced: not torn */
                        if (!gend) { /* extent unknown: up to its last non-zero byte */
                            gend = sz;
                            while (gend > off && m[gend - 1] == 0)
                                gend--;
                        }
                        if (gend > mark) { /* (a file cut short below the mark lost nothing) */
                            munmap(m, sz);
                            close(fd);
                            free(ids);
                            seterr(e, "journal %s is corrupt at offset %zu: the group there fails its checksum, and "
                                      "not as a torn write leaves one (the sectors it did not reach zeroed); it holds "
                                      "records past the LastLogMark: acknowledged records would be lost; refusing to "
                                      "start (inspect it with `bkspark shell readjournal`; restore it, or decommission "
                                      "this bookie so that its ledgers are re-replicated)",
                                   p, off);
                            return E_IO;
                        }
                    }
                }
                if (k >= sz)
                    break;
                if (synced_file && k > from) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s is corrupt at offset %zu but holds valid synced data at offset %zu: "
                              "acknowledged records would be lost; refusing to start (repair or restore the "
                              "journal manually)", p, off, k);
                    return E_IO;
                }
                off = k;
                continue;
            }
            size_t gend = off + JG_HDR + get32(m + off + 4);
            size_t r = off + JG_HDR;
            while (r < gend) {
                int ok = r + JR_HDR <= gend;
                uint32_t len = ok ? get32(m + r) : 0, type = ok ? get32(m + r + 4) : 0;
                ok = ok && len > 0 && len <= gend - r - JR_HDR && type >= JR_ADD && type <= JR_DELETE &&
                     bks_crc32c(bks_crc32c(0, m + r, 8), m + r + JR_HDR, len) == get32(m + r + 8);
                if (!ok) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s: bad record at offset %zu inside a group whose checksum matches", p, r);
                    return E_IO;
                }
                if (r >= from) {
                    replay_record(e, type, m + r + JR_HDR, len);
                    e->st_replay_records++;
                }
                r += JR_HDR + len;
            }
            off = end = gend;
        }
        off = end;
        int garbage = 0;
        for (size_t k = off; k < sz && !garbage; k++)
            garbage = m[k] != 0;
        if (garbage)
            e->st_replay_truncated += sz - off;
        munmap(m, sz);
        if (off < sz && ftruncate(fd, (off_t)off) == 0)
            fdatasync(fd);
        close(fd);
    }
    free(ids);
    return E_OK;
}

static int read_lastmark(Engine *e)
{
    int have = 0;
    for (int d = 0; d < e->nldirs; d++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/lastMark", e->ledger_dirs[d]);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        unsigned char m[32];
        int ok = read_full(fd, m, 32, 0) == 0 && memcmp(m, M_MAGIC, 4) == 0 && get32(m + 24) == bks_crc32c(0, m, 24);
        close(fd);
        if (!ok)
            continue; /* unusable mark: replaying more journal is always safe */
        uint64_t id = get64(m + 8), pos = get64(m + 16);
        if (!have || id > e->mark_id || (id == e->mark_id && pos > e->mark_pos)) {
            e->mark_id = id;
            e->mark_pos = pos;
        }
        have = 1;
    }
    return have;
}

int eng_open(const EngineConfig *cfg, Engine **out, char *err, size_t errlen)
{
    Engine *e = calloc(1, sizeof *e);
    *out = NULL;
    e->journal_dir = strdup(cfg->journal_dir);
    e->nldirs = cfg->nldirs;
    e->ledger_dirs = calloc((size_t)cfg->nldirs, sizeof(char *));
    for (int i = 0; i < cfg->nldirs; i++)
        e->ledger_dirs[i] = strdup(cfg->ledger_dirs[i]);
    e->cache_half = cfg->write_cache_bytes / 2;
    if (e->cache_half < 4096)
        e->cache_half = 4096;
    e->group_wait_ns = cfg->group_wait_us * 1000ull;
    e->threshold = cfg->threshold;
    e->jmax_size = cfg->jmax_size < (1 << 20) ? (1 << 20) : cfg->jmax_size;
    e->max_backups = cfg->max_backups;
    e->jsync = cfg->jsync;
    e->jz_chunk = (e->jmax_size / 4) & ~(uint64_t)(DIO_ALIGN - 1);
    e->jz_chunk = e->jz_chunk > JZ_CHUNK ? JZ_CHUNK : e->jz_chunk < DIO_ALIGN ? DIO_ALIGN : e->jz_chunk;
    e->jz_gap = (e->jmax_size / 8) & ~(uint64_t)(DIO_ALIGN - 1);
    e->jz_gap = e->jz_gap > JZ_GAP ? JZ_GAP : e->jz_gap;
    e->jz_ahead = e->jmax_size < JZ_AHEAD ? e->jmax_size : JZ_AHEAD;
    e->entry_log_max = cfg->entry_log_max < 4096 ? 4096 : cfg->entry_log_max;
    e->compaction_threshold = cfg->compaction_threshold;
    e->compaction_max_bytes = cfg->compaction_max_bytes;
    e->compaction_rate = cfg->compaction_rate;
    e->ckpt_interval_ns = (cfg->ckpt_interval_ms ? cfg->ckpt_interval_ms : 10000) * 1000000ull;
    e->page_cache = cfg->page_cache;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->ckpt_mu, NULL);
    pthread_mutex_init(&e->compact_mu, NULL);
    pthread_cond_init(&e->jcv, NULL);
    pthread_cond_init(&e->synced_cv, NULL);
    pthread_cond_init(&e->gcv, NULL);
    pthread_cond_init(&e->cache_cv, NULL);
    pthread_cond_init(&e->ckpt_cv, NULL);
    pthread_cond_init(&e->compact_cv, NULL);
    pthread_cond_init(&e->z_cv, NULL);
    e->nbuckets = 1024;
    e->buckets = calloc(e->nbuckets, sizeof *e->buckets);
    e->next_inc = 1;
    e->jfd = -1;
    e->jn_fd = -1;
    int rc = E_OK;
    if (mkdirs(e->journal_dir) < 0) {
        seterr(e, "cannot create journal dir %s: %s", e->journal_dir, strerror(errno));
        rc = E_IO;
    }
    for (int i = 0; i < e->nldirs && rc == E_OK; i++)
        if (mkdirs(e->ledger_dirs[i]) < 0) {
            seterr(e, "cannot create ledger dir %s: %s", e->ledger_dirs[i], strerror(errno));
            rc = E_IO;
        }
    e->lock_fds[0] = e->lock_fds[1] = -1;
    for (int k = 0; k < 2 && rc == E_OK; k++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/LOCK", k == 0 ? e->journal_dir : e->ledger_dirs[0]);
        e->lock_fds[k] = open(p, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
        if (e->lock_fds[k] < 0 || flock(e->lock_fds[k], LOCK_EX | LOCK_NB) < 0) {
            seterr(e, "cannot lock %s: %s (is another bookie using this directory?)", p, strerror(errno));
            rc = E_IO;
        }
    }
    int have_mark = 0, have_state = 0;
    Listed *listed = NULL;
    size_t nlisted = 0;
    if (rc == E_OK) {
        have_mark = read_lastmark(e);
        rc = load_state(e, &listed, &nlisted, &have_state);
    }
    if (rc == E_OK && have_mark && !have_state) {
        seterr(e, "lastMark present but ledgers.state missing in %s: refusing to start without fencing state",
               e->ledger_dirs[0]);
        rc = E_IO;
    }
    if (rc == E_OK)
        rc = load_logs(e, listed, nlisted);
    free(listed);
    uint64_t maxj = 0;
    if (rc == E_OK)
        rc = replay_journals(e, have_mark, &maxj);
    if (rc == E_OK) {
        if (j_open_file(e, maxj + 1) < 0) {
            seterr(e, "cannot create journal file in %s: %s", e->journal_dir, strerror(errno));
            rc = E_IO;
        } else {
            e->jfcap = 8;
            e->jfiles = calloc(e->jfcap, sizeof *e->jfiles);
            e->jfiles[0].id = e->jcur_id;
            e->jfiles[0].start_seq = 0;
            e->njfiles = 1;
        }
    }
    if (rc == E_OK) {
        if (pthread_create(&e->jthread, NULL, journal_thread, e) == 0)
            e->jthread_started = 1;
        if (pthread_create(&e->cthread, NULL, ckpt_thread, e) == 0)
            e->cthread_started = 1;
        if (e->jsync && pthread_create(&e->zthread, NULL, jzero_thread, e) == 0)
            e->zthread_started = 1; /* optional: without it the journal uses fallocate'd space */
        if (!e->jthread_started || !e->cthread_started) {
            seterr(e, "cannot start storage threads");
            rc = E_IO;
        }
    }
    if (rc == E_OK && (e->st_replay_records > 0 || !have_state || !have_mark))
        rc = eng_checkpoint(e);
    if (rc != E_OK) {
        snprintf(err, errlen, "%s", e->errmsg);
        eng_close(e, 0);
        eng_free(e);
        return rc;
    }
    *out = e;
    return E_OK;
}

void eng_close(Engine *e, int do_checkpoint)
{
    pthread_mutex_lock(&e->mu);
    e->closing = 1; /* a running pass stops at its next chunk */
    pthread_cond_broadcast(&e->compact_cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->compact_mu);
    ckpt_lock_now(e);
    if (e->closed) {
        pthread_mutex_unlock(&e->ckpt_mu);
        pthread_mutex_unlock(&e->compact_mu);
        return;
    }
    int rc = E_OK;
    if (do_checkpoint && e->jthread_started && !e->j_failed)
        rc = checkpoint_locked(e, 1, 0);
    (void)rc;
    pthread_mutex_lock(&e->mu);
    e->closed = 1;
    e->c_stop = 1;
    e->j_stop = 1;
    pthread_cond_broadcast(&e->jcv);
    pthread_cond_broadcast(&e->ckpt_cv);
    pthread_cond_broadcast(&e->cache_cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->ckpt_mu);
    pthread_mutex_unlock(&e->compact_mu);
    if (e->cthread_started)
        pthread_join(e->cthread, NULL);
    if (e->jthread_started)
        pthread_join(e->jthread, NULL);
    if (e->zthread_started) {
        pthread_mutex_lock(&e->mu);
        e->z_stop = 1;
        pthread_cond_broadcast(&e->z_cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->zthread, NULL);
    }
    if (e->jn_fd >= 0) { /* prepared, never used: an empty journal, which replay accepts */
        close(e->jn_fd);
        e->jn_fd = -1;
    }
    e->cthread_started = e->jthread_started = e->zthread_started = 0;
    if (e->wlog && e->wlog->prealloc > e->wlog->size && e->wlog->fd >= 0) /* unused reservation */
        if (ftruncate(e->wlog->fd, (off_t)e->wlog->size) == 0)
            e->wlog->prealloc = e->wlog->size;
}

void eng_free(Engine *e)
{
    for (size_t s = 0; s < e->nbuckets; s++) {
        Ledger *l = e->buckets[s];
        while (l) {
            Ledger *nx = l->next;
            free(l->locs);
            free(l->lac);
            free(l);
            l = nx;
        }
    }
    free(e->buckets);
    for (size_t i = 0; i < e->nlogs; i++)
        log_release(e->logs[i]);
    free(e->logs);
    for (int c = 0; c < 2; c++) {
        free(e->cache[c].buf);
        free(e->cache[c].ents);
    }
    free(e->pending.buf);
    free(e->writing.buf);
    free(e->fw);
    free(e->fw_tmp);
    free(e->jfiles);
    if (e->jfd >= 0)
        close(e->jfd);
    for (int k = 0; k < 2; k++)
        if (e->lock_fds[k] > 0)
            close(e->lock_fds[k]);
    free(e->journal_dir);
    for (int i = 0; i < e->nldirs; i++)
        free(e->ledger_dirs[i]);
    free(e->ledger_dirs);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->ckpt_mu);
    pthread_mutex_destroy(&e->compact_mu);
    free(e);
}

void eng_lock(Engine *e) { pthread_mutex_lock(&e->mu); }
void eng_unlock(Engine *e) { pthread_mutex_unlock(&e->mu); }
