/* bkspark bookie storage engine: the journal (group commit, journal files, zeroing ahead, sync waits). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- journal */
void jpath(Engine *e, uint64_t id, char *out, size_t n) { snprintf(out, n, "%s/%016llx.txn", e->journal_dir, (unsigned long long)id); }

/* Checksums of a journal record, derived from pcrc = crc32c(payload) without another pass over
 * it: *field = crc32c(len || type || payload) (the record's crc field) and *rec = crc32c of the
 * whole record as it sits in the group (len || type || field || payload), which the group crc is
 * combined from. */
void jrec_crcs(uint32_t type, uint32_t plen, uint32_t pcrc, uint32_t *field, uint32_t *rec)
{
    unsigned char h[JR_HDR];
    put32(h, plen);
    put32(h + 4, type);
    *field = bks_crc32c_combine(bks_crc32c(0, h, 8), pcrc, plen);
    put32(h + 8, *field);
    *rec = bks_crc32c_combine(bks_crc32c(0, h, JR_HDR), pcrc, plen);
}

/* append a record to the pending buffer; caller holds mu.  have_crc: field/rec from jrec_crcs */
int j_enqueue(Engine *e, uint32_t type, const unsigned char *hdr, size_t hlen, const unsigned char *body,
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

int j_enq_add(Engine *e, uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len, uint32_t field,
              uint32_t rec)
{
    unsigned char h[16];
    put64(h, ledger);
    put64(h + 8, (uint64_t)entry);
    return j_enqueue(e, JR_ADD, h, 16, body, len, 1, field, rec);
}

int j_enq_keyrec(Engine *e, uint32_t type, Ledger *l)
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

int j_open_file(Engine *e, uint64_t id)
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
void cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t d)
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
void *journal_thread(void *arg)
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
void *jzero_thread(void *arg)
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
int j_wait(Engine *e, uint64_t seq)
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

void seq_to_mark(Engine *e, uint64_t seq, uint64_t *id, uint64_t *pos)
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
