/* bkspark bookie storage engine (see engine.h for the threading model, README.md for formats). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- helpers */
const char *const eng_tm_names[TM_N] = {"add_crc", "add_locked", "add_syncwait", "cache_wait", "j_groupwait",
                                        "j_crc", "j_write", "j_sync", "f_collect", "f_sort", "f_write",
                                        "f_logsync", "f_idx", "f_repoint", "f_state", "f_jwait",
                                        "j_roll", "f_defsync", "c_repoint"};

/* error message of the last failed engine call on this thread (read by the binding) */
static __thread char tls_err[512];

const char *eng_errmsg(void) { return tls_err; }
void eng_errclear(void) { tls_err[0] = 0; }

void seterr(Engine *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_err, sizeof tls_err, fmt, ap);
    va_end(ap);
    memcpy(e->errmsg, tls_err, sizeof e->errmsg); /* last error of any thread (background flush) */
}

int buf_reserve(Buf *b, size_t extra)
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

int write_full(int fd, const void *buf, size_t len, uint64_t off)
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

int read_full(int fd, void *buf, size_t len, uint64_t off)
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

int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

/* Remove the file at `path` (one that no row lists and no reader holds): cut DELETE_STEP_BYTES off
 * its end at a time, DELETE_PAUSE_NS apart, then unlink it.  Freeing a large file's blocks at once
 * -- on ext4 mounted with `discard`, as here, the discards ride the filesystem journal's commit --
 * stalled every fdatasync meanwhile: a 1 GiB unlink held a 4 KiB fdatasync 48-73 ms, cut 32 MiB at
 * a time 20 ms apart 9-28 ms (2026-12-07, bench/fs_delete_stall.py).  Smaller cuts at the same
 * rate hold each sync for less: in five rounds of `--step-mb 32 --pause-ms 20` against `--step-mb
 * 8 --pause-ms 5` (2026-12-07 ~22:40 UTC), the sync's max meanwhile was 5.0-14.7 ms (median 5.6)
 * against 1.7-9.0 ms (median 2.5), the removal's time 0.78-0.80 s against 0.82-0.85 s a GiB; 4 MiB
 * cuts raised the sync's p99 (0.5 ms against 0.15).  The caller's thread sleeps meanwhile (~0.8 s
 * a GiB): never the checkpoint thread, which alone flushes the write cache (it
 * hands old journals to the reaper: reap_later).  A crash midway leaves a shorter file of the
 * same name, which the caller's rules must already remove unread (compaction's victims: no row
 * lists them; reaped journals: renamed with REAP_SUFFIX, removed at open).  Closing (e->closing) stops the
 * cutting; a file that cannot be opened or cut is unlinked at once. */
#define DELETE_STEP_BYTES (8ull << 20)
#define DELETE_PAUSE_NS 5000000L
void unlink_gradually(Engine *e, const char *path, const char *pause)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        for (uint64_t size = (uint64_t)st.st_size; size > DELETE_STEP_BYTES;) {
            pthread_mutex_lock(&e->mu);
            int closing = e->closing;
            pthread_mutex_unlock(&e->mu);
            size -= DELETE_STEP_BYTES;
            if (closing || ftruncate(fd, (off_t)size) < 0)
                break;
            pthread_mutex_lock(&e->mu);
            pause_point(e, pause); /* (test hook: after a cut) */
            pthread_mutex_unlock(&e->mu);
            nanosleep(&(struct timespec){0, DELETE_PAUSE_NS}, NULL);
        }
    }
    if (fd >= 0)
        close(fd);
    unlink(path);
}

/* Hand `path` -- a journal renamed with REAP_SUFFIX (nothing reads it any more, open removes it) --
 * to the reaper thread, which removes it a step at a time (unlink_gradually) off the caller's
 * thread.  With REAP_QUEUE files waiting it stays on disk under that name: the reaper looks for
 * such files once its queue is empty (the caller -- the checkpoint thread -- never removes a
 * large file itself).  Without the thread (not started, or stopping) it is unlinked at once. */
void reap_later(Engine *e, const char *path)
{
    char *copy = strdup(path);
    pthread_mutex_lock(&e->mu);
    int running = e->rthread_started && !e->r_stop;
    int queued = copy && running && e->reap_n < REAP_QUEUE;
    if (queued)
        e->reap_q[e->reap_n++] = copy;
    else if (running)
        e->reap_rescan = 1;
    pthread_cond_broadcast(&e->r_cv);
    pthread_mutex_unlock(&e->mu);
    if (!queued)
        free(copy);
    if (!running)
        unlink(path);
}

/* each_reaped_journal callback of the reaper: queue `path` while there is room */
static int queue_reaped(Engine *e, const char *path)
{
    char *copy = strdup(path);
    pthread_mutex_lock(&e->mu);
    int room = copy && e->reap_n < REAP_QUEUE;
    if (room)
        e->reap_q[e->reap_n++] = copy;
    else
        e->reap_rescan = 1; /* (the rest at the next look) */
    pthread_mutex_unlock(&e->mu);
    if (!room)
        free(copy);
    return !room;
}

/* the reaper thread: removes queued files in order, one at a time, and looks for renamed journals
 * the queue had no room for once it is empty; until close (which sets closing first: what is
 * queued then is unlinked at once; what is only on disk, at the next open) */
static void *reap_thread(void *arg)
{
    Engine *e = arg;
    pthread_setname_np(pthread_self(), "bks-reap");
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->reap_n && !e->r_stop && !e->reap_rescan)
            cond_wait_ns(&e->r_cv, &e->mu, 1000000000ull);
        if (!e->reap_n && e->reap_rescan && !e->r_stop) {
            e->reap_rescan = 0;
            pthread_mutex_unlock(&e->mu);
            each_reaped_journal(e, queue_reaped);
            /* (a rename gc_journal made and has not synced yet may be among them: synced here,
             * after the listing, before any cut; failing that, they wait for the next open) */
            int synced = 1;
            for (int k = 0; k < e->njournals; k++)
                synced &= fsync_dir(e->jn[k]->dir) == 0;
            pthread_mutex_lock(&e->mu);
            for (; !synced && e->reap_n; e->reap_n--)
                free(e->reap_q[e->reap_n - 1]);
            continue;
        }
        if (!e->reap_n)
            break;
        char *path = e->reap_q[0];
        memmove(&e->reap_q[0], &e->reap_q[1], (e->reap_n - 1) * sizeof *e->reap_q);
        e->reap_n--;
        pthread_mutex_unlock(&e->mu);
        unlink_gradually(e, path, "reap-cut");
        free(path);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static int mkdirs(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, DATA_DIR_MODE) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, DATA_DIR_MODE) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* atomically replace dir/name with data: tmp + fsync + rename + fsync dir */
int write_atomic(const char *dir, const char *name, const void *data, size_t len)
{
    char tmp[4200], dst[4200];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, DATA_FILE_MODE);
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

/* ---------------------------------------------------------------- test hook: pause points */
/* Test hook (tests/storage/test_storage_durability_edges.py): the next thread that reaches the
 * named step blocks there, mu released, until eng_pause_release (or close), so a test can act
 * between two steps of a call deterministically.  One-shot: the step is disarmed when reached.
 * Steps: "delete-enqueued" (eng_delete: its DELETE_LEDGER record queued, not yet synced),
 * "read-scanned" (eng_read_range: between the index scan of step 2 and step 3),
 * "compaction-repointed" (eng_compact: between two batches of its re-pointing).  Caller holds mu. */
void pause_point(Engine *e, const char *name)
{
    if (!pause_armed(e) || strcmp(e->pause_at, name) != 0)
        return;
    __atomic_store_n(&e->pause_armed, 0, __ATOMIC_RELEASE);
    e->paused = 1;
    pthread_cond_broadcast(&e->pause_cv);
    while (e->paused && !e->closing)
        pthread_cond_wait(&e->pause_cv, &e->mu);
    e->paused = 0;
}

void eng_set_pause_point(Engine *e, const char *name)
{
    pthread_mutex_lock(&e->mu);
    snprintf(e->pause_at, sizeof e->pause_at, "%s", name);
    __atomic_store_n(&e->pause_armed, name[0] != 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&e->mu);
}

int eng_pause_wait(Engine *e, uint64_t timeout_ms)
{
    pthread_mutex_lock(&e->mu);
    uint64_t end = now_ns() + timeout_ms * 1000000ull;
    for (uint64_t t = now_ns(); !e->paused && t < end; t = now_ns())
        cond_wait_ns(&e->pause_cv, &e->mu, end - t);
    int r = e->paused;
    pthread_mutex_unlock(&e->mu);
    return r;
}

void eng_pause_release(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->paused = 0;
    pthread_cond_broadcast(&e->pause_cv);
    pthread_mutex_unlock(&e->mu);
}

void eng_set_journal_group_max(Engine *e, uint64_t bytes)
{
    pthread_mutex_lock(&e->mu);
    e->jg_max = bytes && bytes < JG_MAX ? bytes : JG_MAX;
    pthread_mutex_unlock(&e->mu);
}

/* ---------------------------------------------------------------- add / fence / lac / delete */
static int key_eq(Ledger *l, const unsigned char *k, uint32_t kl) { return l->keylen == kl && memcmp(l->key, k, kl) == 0; }

void swap_for_flush(Engine *e)
{
    uint64_t t = now_ns();
    e->fill_ns = e->swap_ns ? t - e->swap_ns : 0;
    e->swap_ns = t;
    e->active ^= 1;
    e->flush_pending = 1;
    for (int k = 0; k < e->njournals; k++) /* the future marks: everything in the swapped half */
        e->jn[k]->flush_mark_seq = e->jn[k]->j_enq;
    pthread_cond_signal(&e->ckpt_cv);
}

/* Wait (mu held) until every journal in `mask` has synced what this thread enqueued to it.  With
 * more than one, the journal threads of all but the first commit theirs meanwhile (each journal's
 * write+fdatasync in parallel, on its own disk); this thread leads the first's commit, then waits
 * for (or leads) the others'. */
static int j_wait_mask(Engine *e, uint64_t mask)
{
    int first = -1, rc = E_OK;
    for (int k = 0; k < e->njournals; k++) {
        if (!(mask >> k & 1))
            continue;
        Journal *j = e->jn[k];
        if (j->j_grouping)
            pthread_cond_signal(&j->gcv); /* this entrant is done: the committer may stop waiting */
        if (first < 0)
            first = k;
        else if (j->j_synced < j->j_enq)
            pthread_cond_signal(&j->jcv);
    }
    for (int k = 0; k < e->njournals && rc == E_OK; k++)
        if (mask >> k & 1)
            rc = j_wait(e->jn[k], e->jn[k]->j_enq);
    return rc;
}

static uint64_t journal_mask(Engine *e, const AddReq *reqs, size_t n)
{
    if (e->njournals == 1)
        return 1;
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++)
        m |= 1ull << (reqs[i].ledger % (uint64_t)e->njournals);
    return m;
}

int eng_add_entries(Engine *e, AddReq *reqs, size_t n, int *status)
{
    uint64_t mask = journal_mask(e, reqs, n); /* the journals this call enqueues to */
    pthread_mutex_lock(&e->mu);
    for (int k = 0; k < e->njournals; k++)
        if (mask >> k & 1)
            e->jn[k]->j_entering++;
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
    for (int k = 0; k < e->njournals; k++)
        if (mask >> k & 1)
            e->jn[k]->j_entering--;
    if (e->closed) {
        pthread_mutex_unlock(&e->mu);
        return E_CLOSED;
    }
    if (j_any_failed(e)) {
        seterr(e, "journal failed: %s", strerror(j_any_failed(e)));
        pthread_mutex_unlock(&e->mu);
        return E_IO;
    }
    int rc = E_OK;
    size_t i = 0;
    while (i < n) {
        AddReq *r = &reqs[i];
        Journal *jr = led_journal(e, r->ledger);
        /* room in the journal's pending group for this entry's records (MASTER_KEY, ADD) first:
         * a group never exceeds its bound (journal.c j_room), and making room may wait for a
         * commit (mu released), so it comes before anything is looked up */
        size_t need = 2 * JR_HDR + 18 + (size_t)r->keylen + 16 + r->len;
        if (j_group_full(jr, need)) {
            uint64_t tw0 = now_ns();
            rc = j_room(jr, need);
            tlw += now_ns() - tw0;
            if (rc != E_OK)
                break;
        }
        Ledger *l;
        if (led_lookup(e, r->ledger, &l) != E_OK) {
            rc = E_IO;
            break;
        }
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
                for (int k = 0; k < e->njournals; k++)
                    pthread_cond_signal(&e->jn[k]->jcv);
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
                if (e->closed || j_any_failed(e)) {
                    rc = e->closed ? E_CLOSED : E_IO;
                    break;
                }
            }
            continue; /* re-check this entry: state may have changed while waiting */
        }
        if (!l) {
            l = led_create(e, r->ledger, 0);
            if (!l) {
                rc = E_IO;
                seterr(e, "out of memory creating ledger %llu", (unsigned long long)r->ledger);
                break;
            }
        }
        if (!l->has_key) {
            if (led_set_key(l, r->key, r->keylen) < 0) {
                rc = E_IO;
                seterr(e, "out of memory storing the master key of ledger %llu", (unsigned long long)r->ledger);
                break;
            }
            led_dirty(e, l);
            if (j_enq_keyrec(jr, JR_MKEY, l) < 0) {
                rc = E_IO;
                seterr(e, "out of memory queueing the journal record of ledger %llu", (unsigned long long)r->ledger);
                break;
            }
        }
        uint64_t off;
        if (cache_put(c, r->ledger, l->inc, r->entry, r->body, r->len, r->lcrc, 1, &off) < 0) {
            rc = E_IO;
            seterr(e, "out of memory growing the write cache for entry %llu:%lld", (unsigned long long)r->ledger,
                   (long long)r->entry);
            break;
        }
        if (loc_set(l, r->entry, WHERE_CACHE0 + (uint32_t)e->active, r->len, off) < 0) {
            rc = E_IO;
            seterr(e, "out of memory indexing entry %llu:%lld in the write cache", (unsigned long long)r->ledger,
                   (long long)r->entry);
            break;
        }
        if (j_enq_add(jr, r->ledger, r->entry, r->body, r->len, r->jcrc, r->rcrc) < 0) {
            rc = E_IO;
            seterr(e, "out of memory queueing entry %llu:%lld for the journal", (unsigned long long)r->ledger,
                   (long long)r->entry);
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
        rc = j_wait_mask(e, mask);
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
    Ledger *l;
    /* (room for the FENCE record first: a group never exceeds its bound, journal.c j_room) */
    int rc = j_room(led_journal(e, ledger), JR_HDR + 18 + (size_t)keylen);
    if (rc == E_OK)
        rc = led_lookup(e, ledger, &l);
    if (rc != E_OK) {
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    if (l && l->has_key && !key_eq(l, key, keylen)) {
        pthread_mutex_unlock(&e->mu);
        return E_UA;
    }
    if (!l)
        l = led_create(e, ledger, 0);
    if (!l) {
        rc = E_IO;
        seterr(e, "out of memory creating ledger %llu", (unsigned long long)ledger);
    } else if (!l->fenced || !l->has_key) {
        if (!l->has_key && led_set_key(l, key, keylen) < 0) {
            pthread_mutex_unlock(&e->mu);
            seterr(e, "out of memory storing the master key of ledger %llu", (unsigned long long)ledger);
            return E_IO;
        }
        l->fenced = 1;
        led_dirty(e, l);
        e->st_fences++;
        if (j_enq_keyrec(led_journal(e, ledger), JR_FENCE, l) < 0)
            rc = E_IO;
    }
    if (rc == E_OK)
        rc = j_wait(led_journal(e, ledger), led_journal(e, ledger)->j_enq);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_set_lac(Engine *e, uint64_t ledger, const unsigned char *lac, uint32_t len)
{
    pthread_mutex_lock(&e->mu);
    Ledger *l = NULL;
    Journal *j = led_journal(e, ledger);
    int rc = e->closed ? E_CLOSED : j_room(j, JR_HDR + 8 + (size_t)len); /* (first: a group never exceeds its bound) */
    if (rc == E_OK)
        rc = led_lookup_durable(e, ledger, &l);
    if (rc == E_OK && !l)
        rc = E_NOLEDGER;
    if (rc == E_OK) {
        unsigned char *p = malloc(len ? len : 1);
        if (!p) {
            rc = E_IO;
            seterr(e, "out of memory storing the explicit LAC of ledger %llu", (unsigned long long)ledger);
        } else {
            memcpy(p, lac, len);
            free(l->lac);
            l->lac = p;
            l->laclen = len;
            l->has_lac = 1;
            led_dirty(e, l);
            unsigned char h[8];
            put64(h, ledger);
            if (j_enqueue(j, JR_LAC, h, 8, lac, len, 0, 0, 0) < 0)
                rc = E_IO;
            else
                rc = j_wait(j, j->j_enq);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Delete a ledger; returns once the delete is durable: its own DELETE_LEDGER record synced, or --
 * when the ledger is already gone -- the one a delete before it queued (a tombstone whose record a
 * concurrent delete is still waiting for would otherwise let this call return at once, and a kill
 * -9 before that record's sync would bring the ledger back).  led_lookup_durable waits for that. */
int eng_delete(Engine *e, uint64_t ledger)
{
    pthread_mutex_lock(&e->mu);
    Ledger *l = NULL;
    Journal *j = led_journal(e, ledger);
    int rc = e->closed ? E_CLOSED : j_room(j, JR_HDR + 8); /* (first: a group never exceeds its bound) */
    if (rc == E_OK)
        rc = led_lookup_durable(e, ledger, &l);
    if (rc == E_OK && l) {
        led_delete(e, l);
        unsigned char h[8];
        put64(h, ledger);
        if (j_enqueue(j, JR_DELETE, h, 8, NULL, 0, 0, 0, 0) < 0) {
            rc = E_IO;
        } else {
            j->del_seq = j->j_enq; /* lookups that find no ledger wait for this (led_lookup_durable) */
            pause_point(e, "delete-enqueued");
            rc = j_wait(j, j->del_seq);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int eng_force(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    int rc = e->closed ? E_CLOSED : j_wait_mask(e, e->njournals >= 64 ? ~0ull : (1ull << e->njournals) - 1);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---------------------------------------------------------------- lifecycle: open, close, free */
static void journal_free(Journal *j);

static Journal *journal_new(Engine *e, int k, const char *dir)
{
    Journal *j = calloc(1, sizeof *j);
    if (!j) {
        seterr(e, "out of memory");
        return NULL;
    }
    j->dir = strdup(dir);
    if (!j->dir) {
        seterr(e, "out of memory");
        free(j);
        return NULL;
    }
    j->e = e;
    j->k = k;
    j->lock_fd = -1;
    j->jfd = -1;
    j->jn_fd = -1;
    j->jz_chunk = (e->jmax_size / 4) & ~(uint64_t)(DIO_ALIGN - 1);
    j->jz_chunk = j->jz_chunk > JZ_CHUNK ? JZ_CHUNK : j->jz_chunk < DIO_ALIGN ? DIO_ALIGN : j->jz_chunk;
    j->jz_gap = (e->jmax_size / 8) & ~(uint64_t)(DIO_ALIGN - 1);
    j->jz_gap = j->jz_gap > JZ_GAP ? JZ_GAP : j->jz_gap;
    j->jz_ahead = e->jmax_size < JZ_AHEAD ? e->jmax_size : JZ_AHEAD;
    int rc = cond_init_monotonic(&j->jcv);
    rc = rc ? rc : cond_init_monotonic(&j->synced_cv);
    rc = rc ? rc : cond_init_monotonic(&j->gcv);
    rc = rc ? rc : cond_init_monotonic(&j->z_cv);
    if (rc != 0) { /* (the conds not made are calloc's zeroes, PTHREAD_COND_INITIALIZER: destroyable) */
        seterr(e, "cannot create the condition variables of journal %s: %s", dir, strerror(rc));
        journal_free(j);
        return NULL;
    }
    return j;
}

static void journal_free(Journal *j)
{
    if (!j)
        return;
    free(j->pending.buf);
    free(j->writing.buf);
    free(j->jfiles);
    if (j->jfd >= 0)
        close(j->jfd);
    if (j->jn_fd >= 0)
        close(j->jn_fd);
    if (j->lock_fd >= 0)
        close(j->lock_fd);
    pthread_cond_destroy(&j->jcv);
    pthread_cond_destroy(&j->synced_cv);
    pthread_cond_destroy(&j->gcv);
    pthread_cond_destroy(&j->z_cv);
    free(j->dir);
    free(j);
}

int eng_open(const EngineConfig *cfg, Engine **out, char *err, size_t errlen)
{
    static uint64_t serials;
    Engine *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return E_IO;
    }
    e->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    e->nldirs = cfg->nldirs;
    e->ledger_dirs = calloc((size_t)cfg->nldirs, sizeof(char *));
    e->ldir_err = calloc((size_t)cfg->nldirs, sizeof(int));
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
    e->entry_log_max = cfg->entry_log_max < 4096 ? 4096 : cfg->entry_log_max;
    e->compaction_threshold = cfg->compaction_threshold;
    e->compaction_max_bytes = cfg->compaction_max_bytes;
    e->compaction_rate = cfg->compaction_rate;
    e->ckpt_interval_ns = (cfg->ckpt_interval_ms ? cfg->ckpt_interval_ms : 10000) * 1000000ull;
    e->page_cache = cfg->page_cache;
    e->index_cache_bytes = cfg->index_cache_bytes ? cfg->index_cache_bytes : (32u << 20);
    e->ledger_cache_max = cfg->ledger_cache_max;
    e->index_memtable_bytes = cfg->index_memtable_bytes ? cfg->index_memtable_bytes : IDX_MEMTABLE;
    const char *crash = getenv("BKSPARK_STORAGE_CRASH_AT");
    snprintf(e->crash_at, sizeof e->crash_at, "%s", crash ? crash : "");
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->ckpt_mu, NULL);
    pthread_mutex_init(&e->compact_mu, NULL);
    int crc = cond_init_monotonic(&e->cache_cv); /* (one not made stays calloc's zeroes: usable by close) */
    crc = crc ? crc : cond_init_monotonic(&e->ckpt_cv);
    crc = crc ? crc : cond_init_monotonic(&e->compact_cv);
    crc = crc ? crc : cond_init_monotonic(&e->pause_cv);
    crc = crc ? crc : cond_init_monotonic(&e->r_cv);
    e->jg_max = JG_MAX;
    e->nbuckets = 1024;
    e->buckets = calloc(e->nbuckets, sizeof *e->buckets);
    e->next_inc = 1;
    e->lock_fd = -1;
    int rc = E_OK;
    int nj = cfg->njournals;
    e->jn = calloc(nj > 0 ? (size_t)nj : 1, sizeof *e->jn);
    if (crc != 0) {
        seterr(e, "cannot create the engine's condition variables: %s", strerror(crc));
        rc = E_IO;
    } else if (nj < 1 || nj > MAX_JOURNALS || !e->jn) {
        seterr(e, "journal_dirs needs 1..%d directories", MAX_JOURNALS);
        rc = E_IO;
    }
    for (int k = 0; k < nj && rc == E_OK; k++) {
        e->jn[k] = journal_new(e, k, cfg->journal_dirs[k]); /* (its error set when NULL) */
        if (!e->jn[k]) {
            rc = E_IO;
            break;
        }
        e->njournals = k + 1;
        if (mkdirs(e->jn[k]->dir) < 0) {
            seterr(e, "cannot create journal dir %s: %s", e->jn[k]->dir, strerror(errno));
            rc = E_IO;
        }
    }
    for (int i = 0; i < e->nldirs && rc == E_OK; i++)
        if (mkdirs(e->ledger_dirs[i]) < 0) {
            seterr(e, "cannot create ledger dir %s: %s", e->ledger_dirs[i], strerror(errno));
            rc = E_IO;
        }
    for (int k = 0; k <= e->njournals && rc == E_OK; k++) { /* every journal dir, then ledger_dirs[0] */
        char p[4200];
        int *fdp = k < e->njournals ? &e->jn[k]->lock_fd : &e->lock_fd;
        snprintf(p, sizeof p, "%s/LOCK", k < e->njournals ? e->jn[k]->dir : e->ledger_dirs[0]);
        *fdp = open(p, O_CREAT | O_RDWR | O_CLOEXEC, DATA_FILE_MODE);
        if (*fdp < 0 || flock(*fdp, LOCK_EX | LOCK_NB) < 0) {
            seterr(e, "cannot lock %s: %s (is another bookie using this directory?)", p, strerror(errno));
            rc = E_IO;
        }
    }
    int have_mark = 0;
    if (rc == E_OK) {
        each_reaped_journal(e, unlink_reaped); /* (a reaper a stop or a kill cut short) */
        have_mark = read_lastmark(e);
        rc = have_mark < 0 ? E_IO : open_index(e, have_mark); /* (converting a format-1 directory first) */
    }
    if (rc == E_OK)
        rc = load_logs(e);
    /* each journal from its own mark, one after another (a ledger's records are all in one
     * journal, so the order between journals does not matter) */
    int all_marks = 1;
    for (int k = 0; k < e->njournals && rc == E_OK; k++) {
        Journal *j = e->jn[k];
        uint64_t maxj = 0;
        all_marks = all_marks && j->have_mark;
        rc = replay_journals(e, j, &maxj);
        if (rc != E_OK)
            break;
        if (j_open_file(j, maxj + 1) < 0) {
            seterr(e, "cannot create journal file in %s: %s", j->dir, strerror(errno));
            rc = E_IO;
            break;
        }
        j->jfcap = 8;
        j->jfiles = calloc(j->jfcap, sizeof *j->jfiles);
        if (!j->jfiles) {
            seterr(e, "out of memory");
            rc = E_IO;
            break;
        }
        j->jfiles[0].id = j->jcur_id;
        j->jfiles[0].start_seq = 0;
        j->njfiles = 1;
    }
    if (rc == E_OK) {
        for (int k = 0; k < e->njournals && rc == E_OK; k++) {
            Journal *j = e->jn[k];
            if (pthread_create(&j->jthread, NULL, journal_thread, j) == 0)
                j->jthread_started = 1;
            else
                rc = E_IO;
            if (e->jsync && pthread_create(&j->zthread, NULL, jzero_thread, j) == 0)
                j->zthread_started = 1; /* optional: without it the journal uses fallocate'd space */
        }
        if (rc == E_OK && pthread_create(&e->rthread, NULL, reap_thread, e) == 0)
            e->rthread_started = 1; /* optional: without it files are unlinked at once */
        if (rc == E_OK && pthread_create(&e->cthread, NULL, ckpt_thread, e) == 0)
            e->cthread_started = 1;
        if (rc != E_OK || !e->cthread_started) {
            seterr(e, "cannot start storage threads");
            rc = E_IO;
        }
    }
    if (rc == E_OK && (e->st_replay_records > 0 || !have_mark || !all_marks || e->st_converted))
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
    pthread_cond_broadcast(&e->pause_cv); /* (a thread held at a test pause point goes on) */
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->compact_mu);
    ckpt_lock_now(e);
    if (e->closed) {
        pthread_mutex_unlock(&e->ckpt_mu);
        pthread_mutex_unlock(&e->compact_mu);
        return;
    }
    int rc = E_OK;
    if (do_checkpoint && e->cthread_started && !j_any_failed(e))
        rc = checkpoint_locked(e, 1, 0);
    (void)rc;
    pthread_mutex_lock(&e->mu);
    e->closed = 1;
    e->c_stop = 1;
    for (int k = 0; k < e->njournals; k++) {
        e->jn[k]->j_stop = 1;
        pthread_cond_broadcast(&e->jn[k]->jcv);
    }
    pthread_cond_broadcast(&e->ckpt_cv);
    pthread_cond_broadcast(&e->cache_cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->ckpt_mu);
    pthread_mutex_unlock(&e->compact_mu);
    if (e->cthread_started)
        pthread_join(e->cthread, NULL);
    if (e->rthread_started) { /* (after the checkpoint thread: nothing queues any more) */
        pthread_mutex_lock(&e->mu);
        e->r_stop = 1;
        pthread_cond_broadcast(&e->r_cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->rthread, NULL);
        pthread_mutex_lock(&e->mu);
        e->rthread_started = 0;
        pthread_mutex_unlock(&e->mu);
    }
    for (int k = 0; k < e->njournals; k++) {
        Journal *j = e->jn[k];
        if (j->jthread_started)
            pthread_join(j->jthread, NULL);
        if (j->zthread_started) {
            pthread_mutex_lock(&e->mu);
            j->z_stop = 1;
            pthread_cond_broadcast(&j->z_cv);
            pthread_mutex_unlock(&e->mu);
            pthread_join(j->zthread, NULL);
        }
        if (j->jn_fd >= 0) { /* prepared, never used: an empty journal, which replay accepts */
            close(j->jn_fd);
            j->jn_fd = -1;
        }
        j->jthread_started = j->zthread_started = 0;
    }
    e->cthread_started = 0;
    if (e->wlog && e->wlog->prealloc > e->wlog->size && e->wlog->fd >= 0) /* unused reservation */
        if (ftruncate(e->wlog->fd, (off_t)e->wlog->size) == 0)
            e->wlog->prealloc = e->wlog->size;
}

void eng_free(Engine *e)
{
    led_free_all(e);
    free(e->buckets);
    free(e->dirty);
    kv_close(e->kv);
    for (size_t i = 0; i < e->nlogs; i++)
        log_release(e->logs[i]);
    free(e->logs);
    for (int c = 0; c < 2; c++) {
        free(e->cache[c].buf);
        free(e->cache[c].ents);
    }
    free(e->fw);
    free(e->fw_tmp);
    for (int k = 0; k < e->njournals; k++)
        journal_free(e->jn[k]);
    free(e->jn);
    if (e->lock_fd >= 0)
        close(e->lock_fd);
    for (int i = 0; i < e->nldirs; i++)
        free(e->ledger_dirs[i]);
    free(e->ledger_dirs);
    free(e->ldir_err);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->ckpt_mu);
    pthread_mutex_destroy(&e->compact_mu);
    free(e);
}

void eng_lock(Engine *e) { pthread_mutex_lock(&e->mu); }
void eng_unlock(Engine *e) { pthread_mutex_unlock(&e->mu); }

/* ---------------------------------------------------------------- accessors for the binding (engine.h; caller holds mu) */
void eng_last_log_mark(Engine *e, uint64_t *id, uint64_t *pos)
{
    *id = e->jn[0]->mark_id;
    *pos = e->jn[0]->mark_pos;
}

int eng_ndirs(Engine *e, int kind) { return kind == 0 ? e->njournals : e->nldirs; }

int eng_dir_error(Engine *e, int kind, int k, const char **path)
{
    if (kind == 0) {
        *path = e->jn[k]->dir;
        return e->jn[k]->j_failed;
    }
    *path = e->ledger_dirs[k];
    return e->ldir_err[k] ? e->ldir_err[k] : (k == 0 ? e->index_failed : 0);
}

void eng_stats(Engine *e, EngineStats *st)
{
    st->adds = e->st_adds;
    st->add_bytes = e->st_add_bytes;
    st->syncs = e->st_syncs;
    st->sync_ns = e->st_sync_ns;
    st->jbytes = e->st_jbytes;
    st->checkpoints = e->st_checkpoints;
    st->flushes = e->st_flushes;
    st->paced_flushes = e->st_paced_flushes;
    st->hurried_flushes = e->st_hurried_flushes;
    st->compactions = e->st_compactions;
    st->compacted_logs = e->st_compacted_logs;
    st->compacted_bytes = e->st_compacted_bytes;
    st->compact_copying = e->st_compact_copying;
    st->replay_records = e->st_replay_records;
    st->replay_truncated = e->st_replay_truncated;
    st->bg_errors = e->st_bg_errors;
    st->fences = e->st_fences;
    st->cache_waits = e->st_cache_waits;
    st->jz_bytes = e->st_jz_bytes;
    st->jz_behind = e->st_jz_behind;
    st->jn_rolls = e->st_jn_rolls;
    st->dio_reads = __atomic_load_n(&e->st_dio_reads, __ATOMIC_RELAXED);
    st->dio_bytes = __atomic_load_n(&e->st_dio_bytes, __ATOMIC_RELAXED);
    st->ra_hits = __atomic_load_n(&e->st_ra_hits, __ATOMIC_RELAXED);
    st->cache_bytes = e->cache[0].used + e->cache[1].used;
    st->pending_len = st->j_waiters = 0;
    for (int k = 0; k < e->njournals; k++) {
        st->pending_len += e->jn[k]->pending.len;
        st->j_waiters += (uint64_t)e->jn[k]->j_waiters;
    }
    st->nledgers = e->nledgers;
    st->index_cache_used = kv_memory(e->kv);
    st->converted = e->st_converted;
    st->nlogs = e->nlogs;
    st->log_live = st->log_total = 0;
    for (size_t i = 0; i < e->nlogs; i++) {
        st->log_live += e->logs[i]->live;
        st->log_total += e->logs[i]->size;
    }
    st->jcur_id = e->jn[0]->jcur_id;
    st->jpos = e->jn[0]->jpos;
    st->njournals = (uint64_t)e->njournals;
    st->j_failed = j_any_failed(e);
    for (int k = 0; k < TM_N; k++)
        st->tm[k] = e->tm[k];
}
