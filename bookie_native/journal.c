/* bkspark bookie storage engine: the journal (group commit, journal files, zeroing ahead, sync waits). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- journal */
void jpath(Journal *j, uint64_t id, char *out, size_t n) { snprintf(out, n, "%s/%016llx.txn", j->dir, (unsigned long long)id); }

int j_any_failed(const Engine *e)
{
    for (int k = 0; k < e->njournals; k++)
        if (e->jn[k]->j_failed)
            return e->jn[k]->j_failed;
    return 0;
}

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
int j_enqueue(Journal *j, uint32_t type, const unsigned char *hdr, size_t hlen, const unsigned char *body,
              size_t blen, int have_crc, uint32_t field, uint32_t rec)
{
    size_t plen = hlen + blen;
    if (buf_reserve(&j->pending, JG_HDR + JR_HDR + plen) < 0)
        return -1;
    if (j->pending.len == 0) { /* room for the group header, filled by the committer */
        j->pending_since_ns = now_ns();
        j->pending.len = JG_HDR;
        j->j_enq += JG_HDR;
        j->pending_gcrc = 0; /* crc32c of the group's records so far (none) */
    }
    if (!have_crc) {
        uint32_t pcrc = bks_crc32c(0, hdr, hlen);
        if (blen)
            pcrc = bks_crc32c(pcrc, body, blen);
        jrec_crcs(type, (uint32_t)plen, pcrc, &field, &rec);
    }
    unsigned char *p = j->pending.buf + j->pending.len;
    put32(p, (uint32_t)plen);
    put32(p + 4, type);
    put32(p + 8, field);
    memcpy(p + JR_HDR, hdr, hlen);
    if (blen)
        memcpy(p + JR_HDR + hlen, body, blen);
    j->pending.len += JR_HDR + plen;
    j->j_enq += JR_HDR + plen;
    j->pending_gcrc = bks_crc32c_combine(j->pending_gcrc, rec, JR_HDR + plen);
    return 0;
}

/* Make room in the pending group for `need` more bytes of records (mu held).  A group's length
 * is a u32 (README "Journal"), so a group's records never exceed e->jg_max (JG_MAX, 1 GiB; a
 * record is at most MAX_BODY plus headers, far below): while the pending group holds records and
 * could not take `need` more, wait until it is committed -- leading the commit when none runs --
 * and look again.  mu is released meanwhile, so a caller makes room before it looks at any state
 * it then changes, and enqueues without releasing mu in between.  (A write cache of 8 GiB under
 * overload used to make one group of over 4 GiB, whose length wrapped: its replay was refused.)
 * Returns E_OK, E_IO if the journal failed while waiting (the error is set), E_CLOSED. */
int j_room(Journal *j, size_t need)
{
    Engine *e = j->e;
    while (!e->closed && j_group_full(j, need))
        if (j_wait(j, j->j_enq) != E_OK)
            return E_IO;
    return e->closed ? E_CLOSED : E_OK;
}

int j_enq_add(Journal *j, uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len, uint32_t field,
              uint32_t rec)
{
    unsigned char h[16];
    put64(h, ledger);
    put64(h + 8, (uint64_t)entry);
    return j_enqueue(j, JR_ADD, h, 16, body, len, 1, field, rec);
}

int j_enq_keyrec(Journal *j, uint32_t type, Ledger *l)
{
    unsigned char h[18 + MAX_KEY];
    put64(h, l->id);
    put64(h + 8, l->inc);
    uint16_t kl = l->keylen;
    memcpy(h + 16, &kl, 2);
    memcpy(h + 18, l->key, kl);
    return j_enqueue(j, type, h, 18 + (size_t)kl, NULL, 0, 0, 0, 0);
}

/* Create journal file `id`: its header durable, and its directory entry.  `prealloc` (not NULL):
 * reserve space with posix_fallocate (best effort; *prealloc = bytes reserved).  `whole_page`:
 * the header's page is written whole (zeros after the header), so a prepared file is written
 * from offset 0 on.  Needs no lock (the caller owns `id`).  Returns the descriptor, -1 (errno). */
static int j_create_file(Journal *j, uint64_t id, uint64_t *prealloc, int whole_page)
{
    Engine *e = j->e;
    char p[4200];
    jpath(j, id, p, sizeof p);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, DATA_FILE_MODE);
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
    if (write_full(fd, hdr, hlen, 0) < 0 || fdatasync(fd) < 0 || fsync_dir(j->dir) < 0) {
        int s = errno;
        close(fd);
        errno = s;
        return -1;
    }
    return fd;
}

/* Make `fd` (journal file `id`, header written) the current journal (mu held, or before the
 * threads start): [0, zeroed) of it is already written, [0, reserved) allocated. */
static void j_use_file(Journal *j, int fd, uint64_t id, uint64_t reserved, uint64_t zeroed)
{
    if (j->jfd >= 0)
        close(j->jfd);
    j->jfd = fd;
    j->jpos = J_HDR;
    j->jprealloc = reserved;
    j->jdropped = 0;
    j->jcur_id = id;
    j->jz_lo = 0;
    j->jz_done = zeroed;
    j->jw_end = DIO_ALIGN; /* the header's page */
    if (j->zthread_started)
        pthread_cond_signal(&j->z_cv);
}

int j_open_file(Journal *j, uint64_t id)
{
    uint64_t pre = 0;
    int fd = j_create_file(j, id, &pre, 0);
    if (fd < 0)
        return -1;
    j_use_file(j, fd, id, pre, 0);
    return 0;
}

/* Roll to the next journal file (mu held): the one the zeroer prepared if it is ready (a swap
 * of descriptors, no I/O under the lock), else created here (create, fallocate, two syncs). */
static int j_roll(Journal *j)
{
    Engine *e = j->e;
    while (j->jn_creating) /* the zeroer is creating it: never race it for the same name */
        pthread_cond_wait(&j->z_cv, &e->mu);
    if (j->jn_fd >= 0 && j->jn_id == j->jcur_id + 1) {
        j_use_file(j, j->jn_fd, j->jn_id, j->jn_done, j->jn_done);
        j->jn_fd = -1;
        e->st_jn_rolls++;
        return 0;
    }
    return j_open_file(j, j->jcur_id + 1);
}

/* Bytes of the next journal file the zeroer should have written by now: as much as the current
 * file has advanced into its last jz_ahead before the roll point (the same pace as the current
 * file's own zeroing, which has stopped by then), so the next file starts jz_ahead written. */
static uint64_t jn_target(const Journal *j)
{
    const Engine *e = j->e;
    uint64_t left = e->jmax_size > j->jw_end ? e->jmax_size - j->jw_end : 0;
    return left >= j->jz_ahead ? DIO_ALIGN : j->jz_ahead - left;
}

/* Whether the zeroer has work the journal just made due (mu held): zeroing ahead in the current
 * file (once a half of jz_ahead was used up), the next file's creation (the journal is within
 * jz_ahead of its roll point), or zeroing the next file (a quarter of jz_ahead behind its pace)
 * -- a wake-up per such step, not per group. */
static int z_due(const Journal *j)
{
    const Engine *e = j->e;
    int bulk = j->jg_avg >= JZ_BULK;
    if (!bulk && j->jz_done < e->jmax_size && j->jz_done < j->jw_end + j->jz_ahead / 2)
        return 1;
    if (j->jw_end + j->jz_ahead < e->jmax_size) /* far from the roll point */
        return 0;
    if (j->jn_fd < 0)
        return !j->jn_creating && now_ns() >= j->jn_retry_ns;
    return !bulk && j->jz_done >= e->jmax_size && j->jn_done + j->jz_ahead / 4 <= jn_target(j);
}

/* The journal is read only by replay: once synced, its pages leave the page cache, so the
 * next groups are copied into pages the kernel already has instead of growing the cache (on
 * the VMs we measure on, first-touch pages made journal writes cost 2 ms of CPU per MB, reused
 * ones 0.2 ms).  The partial last page stays: the next group writes into it. */
static void j_drop_synced(Journal *j, int fd, uint64_t end)
{
    uint64_t upto = end & ~(uint64_t)4095;
    if (upto >= j->jdropped + (1u << 20)) {
        posix_fadvise(fd, (off_t)j->jdropped, (off_t)(upto - j->jdropped), POSIX_FADV_DONTNEED);
        j->jdropped = upto;
    }
}

/* Make *cv a condition variable whose timed waits measure CLOCK_MONOTONIC; every one of the
 * engine's is made here.  With the default clock, CLOCK_REALTIME, a wait's deadline is a wall-clock
 * time: a step of the wall clock (NTP, a VM restored from a snapshot) moves it, and a step back
 * stalled the wait it caught -- a checkpoint, a compaction pace, a journal group's wait, the
 * zeroing of journal files -- by the size of the step.  Returns 0 or the pthread error. */
int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc != 0)
        return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

/* wait on cv (mu held; made by cond_init_monotonic) for at most d nanoseconds */
void cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t d)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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
static void j_commit(Journal *j)
{
    Engine *e = j->e;
    if (j->j_failed) { /* drop: waiters already failed */
        j->j_written = j->j_synced = j->j_enq;
        j->pending.len = 0;
        pthread_cond_broadcast(&j->synced_cv);
        return;
    }
    j->j_busy = 1;
    uint64_t tgw = now_ns();
    j->j_grouping = 1;
    while (!j->j_stop && e->group_wait_ns && j->pending.len < e->threshold && j->j_entering > 0) {
        uint64_t deadline = j->pending_since_ns + e->group_wait_ns;
        uint64_t t = now_ns();
        if (t >= deadline)
            break;
        cond_wait_ns(&j->gcv, &e->mu, deadline - t);
    }
    j->j_grouping = 0;
    TM_ADD(e, TM_J_GROUPWAIT, now_ns() - tgw);
    Buf tmp = j->writing;
    uint32_t gcrc = j->pending_gcrc;
    j->writing = j->pending;
    j->pending = tmp;
    j->pending.len = 0;
    uint64_t start = j->j_written, end = start + j->writing.len;
    int err = 0;
    if (j->jpos >= e->jmax_size) { /* roll */
        uint64_t tr = now_ns();
        int ro = j_roll(j);
        TM_ADD(e, TM_J_ROLL, now_ns() - tr);
        if (ro < 0) {
            err = errno;
        } else {
            if (j->njfiles == j->jfcap) {
                size_t nc = j->jfcap ? j->jfcap * 2 : 8;
                void *p = realloc(j->jfiles, nc * sizeof *j->jfiles);
                if (p) {
                    j->jfiles = p;
                    j->jfcap = nc;
                }
            }
            if (j->njfiles < j->jfcap) {
                j->jfiles[j->njfiles].id = j->jcur_id;
                j->jfiles[j->njfiles].start_seq = start;
                j->njfiles++;
            } else {
                err = ENOMEM; /* the group fails: the journal files' list cannot grow */
            }
        }
    }
    int fd = j->jfd;
    uint64_t pos = j->jpos, jid = j->jcur_id;
    /* the group is written up to its page's end (zeros after it, which the next group
     * overwrites): a write ending inside a page of a written block would read that page first */
    size_t wlen = j->writing.len, pad = (size_t)((DIO_ALIGN - ((pos + wlen) & (DIO_ALIGN - 1))) & (DIO_ALIGN - 1));
    if (j->writing.cap < wlen + pad && buf_reserve(&j->writing, pad) < 0)
        pad = 0;
    memset(j->writing.buf + wlen, 0, pad);
    wlen += pad;
    while (j->jz_to && j->jz_file == jid && pos + wlen > j->jz_from) /* never write where the zeroer does */
        pthread_cond_wait(&j->z_cv, &e->mu);
    int zeroed = pos >= j->jz_lo && pos + wlen <= j->jz_done;
    if (!zeroed)
        e->st_jz_behind++;
    j->jw_end = (pos + wlen + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1);
    j->jg_avg = j->jg_avg - (j->jg_avg >> 3) + (wlen >> 3);
    if (j->zthread_started && z_due(j))
        pthread_cond_signal(&j->z_cv);
    pthread_mutex_unlock(&e->mu);
    uint64_t t0 = now_ns();
    {
        unsigned char *g = j->writing.buf;
        unsigned char idb[8];
        memcpy(g, "BKSG", 4);
        put32(g + 4, (uint32_t)(j->writing.len - JG_HDR));
        put32(g + 8, gcrc); /* combined from the records' crcs as they were enqueued */
        put64(g + 12, pos); /* a copy of a group inside an entry body can't pass for a real one */
        put64(idb, jid);
        put32(g + 20, bks_crc32c(bks_crc32c(0, idb, 8), g, 20));
    }
    uint64_t tc = now_ns();
    TM_ADD(e, TM_J_CRC, tc - t0);
    if (!err && !zeroed && pos + wlen > j->jprealloc) { /* the zeroer is behind: reserve space */
        uint64_t grow = JPREALLOC > wlen ? JPREALLOC : wlen;
        if (posix_fallocate(fd, (off_t)j->jprealloc, (off_t)(pos + grow - j->jprealloc)) == 0)
            j->jprealloc = pos + grow;
    }
    if (!err && write_full(fd, j->writing.buf, wlen, pos) < 0)
        err = errno;
    uint64_t tw = now_ns();
    TM_ADD(e, TM_J_WRITE, tw - tc);
    if (!err && e->jsync && fdatasync(fd) < 0)
        err = errno;
    if (!err && e->jsync)
        j_drop_synced(j, fd, pos + j->writing.len);
    uint64_t t1 = now_ns();
    TM_ADD(e, TM_J_SYNC, t1 - tw);
    pthread_mutex_lock(&e->mu);
    if (err) {
        j->j_failed = err;
        seterr(e, "journal write/sync failed (%s): %s", j->dir, strerror(err));
    } else {
        j->jpos = pos + j->writing.len;
    }
    e->st_syncs++;
    e->st_sync_ns += t1 - t0;
    e->st_jbytes += j->writing.len;
    j->j_written = end;
    j->j_synced = end;
    j->j_busy = 0;
    pthread_cond_broadcast(&j->synced_cv);
    if (j->j_stop)
        pthread_cond_broadcast(&j->jcv); /* the journal thread drains what is left, then exits */
}

/* Commits what nobody waits for at close; otherwise the waiters commit their own records. */
void *journal_thread(void *arg)
{
    Journal *j = arg;
    Engine *e = j->e;
    char tn[16];
    snprintf(tn, sizeof tn, j->k ? "bks-journal%d" : "bks-journal", j->k);
    pthread_setname_np(pthread_self(), tn);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (j->j_busy || (j->pending.len == 0 && !j->j_stop)) {
            pthread_cond_wait(&j->jcv, &e->mu);
            continue;
        }
        if (j->pending.len == 0)
            break; /* stopping, and nothing left */
        j_commit(j);
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
    Journal *j = arg;
    Engine *e = j->e;
    char tn[16];
    snprintf(tn, sizeof tn, j->k ? "bks-jzero%d" : "bks-jzero", j->k);
    pthread_setname_np(pthread_self(), tn);
    void *zb = NULL;
    if (posix_memalign(&zb, DIO_ALIGN, j->jz_chunk) != 0)
        return NULL;
    memset(zb, 0, j->jz_chunk);
    int fd = -1;
    uint64_t fid = 0;
    pthread_mutex_lock(&e->mu);
    while (!j->z_stop) {
        uint64_t near = j->jw_end + j->jz_gap, from = j->jz_done > near ? j->jz_done : near;
        uint64_t id = j->jcur_id;
        int bulk = j->jg_avg >= JZ_BULK; /* big groups: fallocate'd space costs them less */
        if (j->j_failed) {
            cond_wait_ns(&j->z_cv, &e->mu, 200000000ull);
            continue;
        }
        if (bulk || from >= j->jw_end + j->jz_ahead || from >= e->jmax_size + j->jz_chunk) {
            /* nothing to zero in this file now: the next file, once the roll is near */
            if (j->jw_end + j->jz_ahead < e->jmax_size) {
                cond_wait_ns(&j->z_cv, &e->mu, 200000000ull);
                continue;
            }
            if (j->jn_fd < 0) { /* create the next one: header and directory entry durable */
                uint64_t t = now_ns();
                if (t < j->jn_retry_ns) {
                    cond_wait_ns(&j->z_cv, &e->mu, j->jn_retry_ns - t);
                    continue;
                }
                uint64_t nid = j->jcur_id + 1;
                j->jn_creating = 1;
                pthread_mutex_unlock(&e->mu);
                int nfd = j_create_file(j, nid, NULL, 1);
                pthread_mutex_lock(&e->mu);
                j->jn_creating = 0;
                pthread_cond_broadcast(&j->z_cv); /* a roll waiting for it */
                if (nfd >= 0) {
                    j->jn_fd = nfd;
                    j->jn_id = nid;
                    j->jn_done = DIO_ALIGN;
                } else { /* (disk full...): the roll creates it itself; try again later */
                    j->jn_retry_ns = now_ns() + 1000000000ull;
                }
                continue;
            }
            if (bulk || j->jz_done < e->jmax_size || j->jn_done >= jn_target(j) ||
                j->jn_done >= j->jz_ahead) {
                cond_wait_ns(&j->z_cv, &e->mu, 200000000ull);
                continue;
            }
            id = j->jn_id;
            from = j->jn_done;
        }
        j->jz_file = id;
        j->jz_from = from;
        j->jz_to = from + j->jz_chunk;
        pthread_mutex_unlock(&e->mu);
        int unsupported = 0;
        if (fd >= 0 && fid != id) {
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            char p[4200];
            jpath(j, id, p, sizeof p);
            fd = open(p, O_WRONLY | O_DIRECT | O_CLOEXEC);
            fid = id;
            unsupported = fd < 0 && errno == EINVAL;
        }
        int ok = fd >= 0 && pwrite(fd, zb, j->jz_chunk, (off_t)from) == (ssize_t)j->jz_chunk && fdatasync(fd) == 0;
        pthread_mutex_lock(&e->mu);
        j->jz_to = 0;
        pthread_cond_broadcast(&j->z_cv); /* a group waiting for this chunk */
        if (ok && j->jcur_id == id) { /* the current file (perhaps the next one, rolled to meanwhile) */
            if (j->jz_done != from) /* the zeroed run starts over (a new file, or it fell behind) */
                j->jz_lo = from;
            j->jz_done = from + j->jz_chunk;
        } else if (ok && j->jn_fd >= 0 && j->jn_id == id) {
            j->jn_done = from + j->jz_chunk;
        }
        if (ok)
            e->st_jz_bytes += j->jz_chunk;
        if (unsupported)
            break;
        if (!ok)
            cond_wait_ns(&j->z_cv, &e->mu, 1000000000ull);
    }
    pthread_mutex_unlock(&e->mu);
    if (fd >= 0)
        close(fd);
    free(zb);
    return NULL;
}

/* wait (holding mu) until everything enqueued up to seq is durable, committing it on this
 * thread when no commit is running */
int j_wait(Journal *j, uint64_t seq)
{
    Engine *e = j->e;
    j->j_waiters++;
    while (j->j_synced < seq && !j->j_failed) {
        if (!j->j_busy) {
            j_commit(j);
            continue;
        }
        if (j->j_grouping)
            pthread_cond_signal(&j->gcv); /* this entrant is done: the committer may stop waiting */
        pthread_cond_wait(&j->synced_cv, &e->mu);
    }
    j->j_waiters--;
    if (j->j_failed) {
        seterr(e, "journal failed (%s): %s", j->dir, strerror(j->j_failed));
        return E_IO;
    }
    return E_OK;
}

void seq_to_mark(Journal *j, uint64_t seq, uint64_t *id, uint64_t *pos)
{
    for (size_t i = j->njfiles; i-- > 0;) {
        if (j->jfiles[i].start_seq <= seq) {
            *id = j->jfiles[i].id;
            *pos = J_HDR + (seq - j->jfiles[i].start_seq);
            return;
        }
    }
    *id = j->jfiles[0].id;
    *pos = J_HDR;
}
