/* bkspark bookie storage engine: the state file, LastLogMark, journal gc and the checkpoint (flush) thread. */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- index durability, lastMark */
/* Test hook (tests/storage/test_storage_index_crash.py): BKSPARK_STORAGE_CRASH_AT=<name> kills the
 * process with SIGKILL at that step -- a kill -9 at an exact point of the checkpoint protocol. */
void crash_point(Engine *e, const char *name)
{
    if (e->crash_at[0] && strcmp(e->crash_at, name) == 0)
        raise(SIGKILL);
}

void eng_set_crash_point(Engine *e, const char *name)
{
    pthread_mutex_lock(&e->mu);
    snprintf(e->crash_at, sizeof e->crash_at, "%s", name);
    pthread_mutex_unlock(&e->mu);
}

/* Make everything the index batches so far refer to durable: the entry logs and their .idx files
 * written since the last call (fdatasync), then the index itself (RocksDB's WAL).  Runs before
 * any lastMark is written, so the mark never passes what the index on disk covers. */
int index_sync(Engine *e)
{
    uint64_t t0 = now_ns();
    int rc = sync_dirty_logs(e);
    TM_ADD(e, TM_F_DEFSYNC, now_ns() - t0);
    if (rc == E_OK && e->index_failed) {
        seterr(e, "a ledger index write failed earlier: checkpoints are disabled until restart");
        rc = E_IO;
    }
    if (rc == E_OK)
        rc = kv_sync(e);
    return rc;
}

/* journal k's mark file: lastMark (journal 0, the single-journal name) or lastMark.<k> */
void mark_name(int k, char *out, size_t n)
{
    if (k == 0)
        snprintf(out, n, "lastMark");
    else
        snprintf(out, n, "lastMark.%d", k);
}

static int write_lastmark(Engine *e, int k, uint64_t id, uint64_t pos)
{
    char name[32];
    mark_name(k, name, sizeof name);
    unsigned char m[32];
    memset(m, 0, sizeof m);
    memcpy(m, M_MAGIC, 4);
    put32(m + 4, 1);
    put64(m + 8, id);
    put64(m + 16, pos);
    put32(m + 24, bks_crc32c(0, m, 24));
    for (int d = 0; d < e->nldirs; d++) {
        if (write_atomic(e->ledger_dirs[d], name, m, sizeof m) < 0) {
            int err = errno;
            seterr(e, "cannot write %s in %s: %s", name, e->ledger_dirs[d], strerror(err));
            ldir_fail(e, d, err);
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
uint64_t *list_journals(Journal *j, size_t *n)
{
    *n = 0;
    DIR *d = opendir(j->dir);
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
 * mark).  Runs without ckpt_mu: unlinking a 512 MiB file takes ~130 ms here, flushes need not wait.
 * Each is renamed out of the journal names first (REAP_SUFFIX: no replay lists it, open removes
 * it) and handed to the reaper thread, which cuts it a step at a time (unlink_gradually): a
 * 512 MiB unlink at once held the journal's fdatasyncs for tens of ms on ext4 with discard, and
 * cutting it here, on the checkpoint thread -- the write cache's only flusher -- held adds
 * 0.4-0.7 s.  A rename a crash loses leaves the journal as it was: older than the mark, never
 * replayed, deleted by the next pass. */
static void gc_journal(Engine *e, Journal *j)
{
    pthread_mutex_lock(&e->mu);
    uint64_t mark_id = j->mark_id;
    int done = mark_id == j->jgc_mark;
    j->jgc_mark = mark_id;
    pthread_mutex_unlock(&e->mu);
    if (done)
        return;
    size_t n;
    uint64_t *ids = list_journals(j, &n);
    if (!ids)
        return;
    size_t older = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < mark_id)
            older++;
    size_t keep = (size_t)(e->max_backups > 0 ? e->max_backups : 0);
    size_t renamed = 0; /* (their ids moved to the front of ids) */
    char p[4200], del[4300];
    for (size_t i = 0; i + keep < older; i++) {
        jpath(j, ids[i], p, sizeof p);
        snprintf(del, sizeof del, "%s" REAP_SUFFIX, p);
        if (rename(p, del) == 0)
            ids[renamed++] = ids[i];
        else
            unlink(p);
    }
    /* the renames durable before any cut (a cut a crash kept under the journal's own name would be
     * a prefix a replay without a readable mark reads); if they cannot be made so, unlinked now */
    int durable = renamed && fsync_dir(j->dir) == 0;
    for (size_t i = 0; i < renamed; i++) {
        jpath(j, ids[i], p, sizeof p);
        snprintf(del, sizeof del, "%s" REAP_SUFFIX, p);
        if (durable)
            reap_later(e, del);
        else
            unlink(del);
    }
    free(ids);
}

static void gc_journals(Engine *e)
{
    for (int k = 0; k < e->njournals; k++)
        gc_journal(e, e->jn[k]);
}

/* ---------------------------------------------------------------- the index batch of a flush */
typedef struct {
    uint64_t id;
    uint32_t purge_seq;
    int purge, deleted;
} Snap;

typedef struct {
    uint32_t where;
    int64_t bytes;
} Debit;

typedef struct {
    Debit *v;
    size_t n, cap;
} Debits;

static int debit_add(Debits *d, uint32_t where, int64_t bytes)
{
    for (size_t i = d->n; i-- > 0 && i + 8 >= d->n;) /* (consecutive entries share a log) */
        if (d->v[i].where == where) {
            d->v[i].bytes += bytes;
            return 0;
        }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 64;
        Debit *p = realloc(d->v, nc * sizeof *p);
        if (!p)
            return -1;
        d->v = p;
        d->cap = nc;
    }
    d->v[d->n++] = (Debit){where, bytes};
    return 0;
}

static int debit_loc(void *arg, const Loc *lc) { return debit_add(arg, lc->where, -(int64_t)(LR_HDR + lc->len)); }
static int debit_bytes(void *arg, uint32_t where, uint32_t bytes) { return debit_add(arg, where, -(int64_t)bytes); }

/* the ledgers with changes the index has not received (mu held); clears their dirty flags */
static Snap *collect_dirty(Engine *e, size_t *ns)
{
    size_t n = 0, cap = e->ndirty == SIZE_MAX ? e->nledgers : e->ndirty;
    Snap *v = malloc((cap ? cap : 1) * sizeof *v);
    if (!v)
        return NULL;
    if (e->ndirty == SIZE_MAX) { /* the list could not grow: walk the cache */
        for (size_t s = 0; s < e->nbuckets; s++)
            for (Ledger *l = e->buckets[s]; l; l = l->next)
                if (l->dirty)
                    v[n++] = (Snap){l->id, l->purge_seq, l->purge, l->deleted};
    } else {
        for (size_t i = 0; i < e->ndirty; i++) {
            Ledger *l = led_mem(e, e->dirty[i]);
            if (l && l->dirty) {
                v[n++] = (Snap){l->id, l->purge_seq, l->purge, l->deleted};
                l->dirty = 0; /* (an id listed twice is taken once) */
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        Ledger *l = led_mem(e, v[i].id);
        l->dirty = 0;
        l->inflight = 1; /* evicted before the batch is written, a lookup would read the old record */
    }
    e->ndirty = 0;
    *ns = n;
    return v;
}

/* The memory location of a flushed item's entry, if its ledger is still the incarnation it was
 * written for (mu held); (*l, *hint): a cursor over the items, which are sorted by ledger. */
static Loc *item_loc(Engine *e, const WItem *x, Ledger **l, size_t *hint)
{
    if (!*l || (*l)->id != x->ledger) {
        *l = led_mem(e, x->ledger);
        *hint = 0;
    }
    if (!*l || (*l)->deleted || (*l)->inc != x->inc)
        return NULL;
    return loc_get_hint(*l, x->entry, hint);
}

/* Hand a flush's results to the index in one atomic batch, then drop the in-memory locations it
 * covers (re-pointed from the write cache to the entry logs by flush_cache_slot).  The batch holds, in this order: the removal of every ledger deleted since the last batch
 * (record + all locations), the records of the ledgers changed since (key, fence, explicit LAC,
 * incarnation), the new locations of the flushed entries, and the entry-log table rows that
 * changed.  It is written without syncing the WAL (index_sync does that before a mark moves; until
 * then the journal covers all of it).  Only after it is written are the memory locations dropped,
 * so a reader that misses in memory finds the entry in the index.  Caller holds ckpt_mu (the only
 * writer of flush batches), not mu. */
static int index_batch(Engine *e, WItem *w, size_t n)
{
    KvBatch *b = kvb_new();
    Debits deb = {0};
    int rc = E_OK;
    size_t ns = 0;
    pthread_mutex_lock(&e->mu);
    Snap *snap = b ? collect_dirty(e, &ns) : NULL;
    if (!snap) {
        pthread_mutex_unlock(&e->mu);
        kvb_free(b);
        seterr(e, "out of memory building a ledger index batch");
        return E_IO;
    }
    for (size_t i = 0; i < ns; i++)
        if (snap[i].purge)
            kvb_del_ledger(b, snap[i].id);
    for (size_t i = 0; i < ns && rc == E_OK; i++)
        if (!snap[i].deleted && kvb_put_ledger(b, led_mem(e, snap[i].id)) < 0)
            rc = E_IO;
    Ledger *l = NULL;
    size_t hint = 0;
    for (size_t i = 0; i < n; i++) {
        WItem *x = &w[i];
        Loc *lc = item_loc(e, x, &l, &hint);
        x->state = 0;
        if (!lc || lc->where != x->where || lc->off != x->dst_off || lc->len != x->len)
            continue; /* re-added (or deleted) meanwhile: the newer copy goes with the next flush */
        x->state = !l->purge && x->entry <= l->flushed_last ? 2 : 1;
    }
    kvb_put_meta(b, "next_inc", e->next_inc);
    pthread_mutex_unlock(&e->mu);

    /* what the batch replaces, read before it is written: the locations of deleted incarnations and
     * of re-added entries, whose bytes their logs no longer hold live */
    for (size_t i = 0; i < ns && rc == E_OK; i++)
        if (snap[i].purge && kv_scan_locs(e, snap[i].id, 0, INT64_MAX, debit_loc, &deb) < 0)
            rc = E_IO;
    /* the new locations, one ledger at a time (w is sorted by ledger, entry), as runs; where a re-add
     * may replace indexed copies, the runs holding them are cut and their bytes debited */
    Loc *lv = n ? malloc(n * sizeof *lv) : NULL;
    if (n && !lv)
        rc = E_IO;
    for (size_t i = 0; i < n && rc == E_OK;) {
        size_t k = 0;
        int replace = 0;
        uint64_t ledger = w[i].ledger;
        for (; i < n && w[i].ledger == ledger; i++) {
            WItem *x = &w[i];
            if (!x->state)
                continue;
            replace |= x->state == 2;
            lv[k++] = (Loc){x->entry, x->where, x->len, x->dst_off};
            if (debit_add(&deb, x->where, (int64_t)(LR_HDR + x->len)) < 0)
                rc = E_IO;
        }
        if (rc == E_OK && kvb_put_locs(e, b, ledger, lv, k, replace, debit_bytes, &deb) < 0)
            rc = E_IO;
    }
    free(lv);
    if (rc == E_OK) {
        pthread_mutex_lock(&e->mu);
        for (size_t i = 0; i < deb.n; i++) {
            LogFile *lf = log_find(e, deb.v[i].where);
            if (lf) {
                lf->live = (uint64_t)((int64_t)lf->live + deb.v[i].bytes);
                lf->gdirty = 1;
            }
        }
        for (size_t i = 0; i < e->nlogs; i++) {
            LogFile *lf = e->logs[i];
            if (lf->gdirty || lf->id >= e->flush_from_log) {
                kvb_put_log(b, lf->id, lf->size, lf->idx_size, lf->live);
                lf->gdirty = 0;
            }
        }
        pthread_mutex_unlock(&e->mu);
        uint64_t t = now_ns();
        rc = kvb_write(e, b, 0);
        TM_ADD(e, TM_F_IDX, now_ns() - t);
    }
    kvb_free(b);
    free(deb.v);
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < ns; i++) {
        Ledger *sl = led_mem(e, snap[i].id);
        if (sl)
            sl->inflight = 0;
    }
    if (rc != E_OK) {
        /* sticky: the live-byte counts and the cache may now disagree with the index; the journal
         * covers everything (the mark never moves again), a restart replays it */
        if (!e->index_failed)
            e->index_failed = EIO;
        for (size_t i = 0; i < ns; i++) {
            Ledger *sl = led_mem(e, snap[i].id);
            if (sl)
                led_dirty(e, sl);
        }
    } else {
        e->index_gen++;
        /* drop the cache locations the batch covers: marked per ledger, then each ledger's array
         * compacted once (items are sorted by ledger; removing one at a time was quadratic) */
        l = NULL;
        for (size_t i = 0; i <= n; i++) {
            WItem *x = i < n ? &w[i] : NULL;
            if (x && !x->state)
                continue;
            if (!x || !l || l->id != x->ledger) {
                if (l)
                    loc_compact(l);
                if (!x)
                    break;
                l = led_mem(e, x->ledger);
                if (l && (l->deleted || l->inc != x->inc))
                    l = NULL;
                hint = 0;
            }
            if (!l)
                continue;
            if (x->entry > l->flushed_last)
                l->flushed_last = x->entry;
            Loc *lc = loc_get_hint(l, x->entry, &hint);
            if (lc && lc->where == x->where && lc->off == x->dst_off && lc->len == x->len)
                lc->where = WHERE_DROPPED;
        }
        for (size_t i = 0; i < ns; i++) {
            Ledger *sl = led_mem(e, snap[i].id);
            if (!sl)
                continue;
            if (snap[i].purge && sl->purge && sl->purge_seq == snap[i].purge_seq)
                sl->purge = 0; /* no delete since: the index holds nothing stale of it now */
            if (sl->deleted && !sl->purge && !sl->dirty)
                led_free(e, sl); /* the tombstone has done its work */
        }
        led_evict(e, SIZE_MAX);
    }
    pthread_mutex_unlock(&e->mu);
    free(snap);
    return rc;
}

/* ---------------------------------------------------------------- checkpoint */
/* The flushed half is free for the adds again (mu held). */
static void release_slot(Engine *e, int slot)
{
    e->flush_failed = 0;
    cache_reset(&e->cache[slot], e->cache_half);
    e->flush_pending = 0;
    pthread_cond_broadcast(&e->cache_cv);
}

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
        if (!e->fw_cap) {
            seterr(e, "out of memory for a flush of %zu entries", c->n);
            return E_IO;
        }
    }
    WItem *w = e->fw;
    /* collect live entries (those the ledger cache still points at) */
    pthread_mutex_lock(&e->mu);
    if (e->index_failed) {
        pthread_mutex_unlock(&e->mu);
        seterr(e, "a ledger index write failed earlier: flushes are disabled until restart");
        return E_IO;
    }
    if (ldir_check(e, "flushes") != E_OK) { /* (the write cache keeps the entries: reads go on) */
        pthread_mutex_unlock(&e->mu);
        return E_IO;
    }
    e->flushing = 1; /* until the index batch is written: keeps compaction off the logs written here */
    e->flush_from_log = e->wlog ? e->wlog->id : e->next_log_id;
    uint64_t t0 = now_ns();
    size_t n = 0, hint = 0;
    Ledger *l = NULL;
    for (size_t i = 0; i < c->n; i++) {
        CEnt *ce = &c->ents[i];
        if (!l || l->id != ce->ledger) {
            l = led_mem(e, ce->ledger); /* (a ledger with cache entries is pinned in memory) */
            hint = 0;
        }
        if (!l || l->deleted || l->inc != ce->inc)
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
    uint64_t t2 = now_ns();
    if (rc == E_OK) {
        /* point the memory locations at the written copies and give the half back to the adds
         * now: the index batch (the slow part: a RocksDB insert per entry) overlaps the next fill */
        pthread_mutex_lock(&e->mu);
        l = NULL;
        for (size_t i = 0; i < n; i++) {
            WItem *x = &w[i];
            Loc *lc = item_loc(e, x, &l, &hint);
            if (lc && lc->where == WHERE_CACHE0 + (uint32_t)slot && lc->off == x->cache_off && lc->len == x->len) {
                lc->where = x->where;
                lc->off = x->dst_off;
            }
        }
        release_slot(e, slot);
        pthread_mutex_unlock(&e->mu);
        rc = index_batch(e, w, n);
    }
    if (rc == E_OK)
        crash_point(e, "index-batch-written");
    pthread_mutex_lock(&e->mu);
    e->flushing = 0;
    TM_ADD(e, TM_F_REPOINT, now_ns() - t2);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Flush the write cache (swap halves, write the swapped one to entry logs, then its index batch).
 * When `full` (or a second has passed since the last full one) also make the logs and the index
 * durable (index_sync) and move the LastLogMark to the end of the flushed data; the caller then
 * deletes old journals.  A flush without a new mark is safe: the journal still covers the flushed
 * data, and a restart replays it over whatever part of the batch survived.  Caller holds ckpt_mu,
 * not mu. */
int checkpoint_locked(Engine *e, int full, int paced)
{
    pthread_mutex_lock(&e->mu);
    int jf = j_any_failed(e);
    if (jf) {
        pthread_mutex_unlock(&e->mu);
        seterr(e, "journal failed: %s", strerror(jf));
        return E_IO;
    }
    if (!e->flush_pending)
        swap_for_flush(e);
    int nj = e->njournals;
    uint64_t mark_seq[MAX_JOURNALS];
    for (int k = 0; k < nj; k++)
        mark_seq[k] = e->jn[k]->flush_mark_seq;
    int slot = !e->active;
    uint64_t budget = paced ? e->fill_ns / 2 : 0;
    if (budget > 1000000000ull)
        budget = 1000000000ull;
    if (budget)
        e->st_paced_flushes++;
    uint64_t tj = now_ns();
    int rc = E_OK;
    for (int k = 1; k < nj; k++) /* the journal threads commit the others' meanwhile */
        if (e->jn[k]->j_synced < mark_seq[k])
            pthread_cond_signal(&e->jn[k]->jcv);
    for (int k = 0; k < nj && rc == E_OK; k++)
        rc = j_wait(e->jn[k], mark_seq[k]);
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
    e->st_flushes++; /* (flush_cache_slot released the half) */
    if (!full && now_ns() - e->last_full_ns < 1000000000ull) {
        pthread_mutex_unlock(&e->mu);
        return E_OK;
    }
    uint64_t mid[MAX_JOURNALS], mpos[MAX_JOURNALS];
    for (int k = 0; k < nj; k++)
        seq_to_mark(e->jn[k], mark_seq[k], &mid[k], &mpos[k]);
    pthread_mutex_unlock(&e->mu);
    uint64_t tst = now_ns();
    rc = index_sync(e);
    if (rc != E_OK)
        return rc;
    crash_point(e, "index-synced");
    /* journal 0's lastMark last: a lastMark with a lastMark.<k> missing for some k < njournals
     * then means the journal count grew (read_lastmark refuses that) */
    for (int k = nj; k-- > 0 && rc == E_OK;)
        rc = write_lastmark(e, k, mid[k], mpos[k]);
    if (rc != E_OK)
        return rc;
    crash_point(e, "mark-written");
    pthread_mutex_lock(&e->mu);
    for (int k = 0; k < nj; k++) {
        e->jn[k]->mark_id = mid[k];
        e->jn[k]->mark_pos = mpos[k];
        e->jn[k]->have_mark = 1;
    }
    e->st_checkpoints++;
    e->last_full_ns = now_ns();
    pthread_mutex_unlock(&e->mu);
    TM_ADD(e, TM_F_STATE, now_ns() - tst);
    return E_OK; /* the caller deletes the journals it freed (gc_journals), without ckpt_mu */
}

/* Take ckpt_mu without waiting out a paced flush's budget: the flush stops pacing. */
void ckpt_lock_now(Engine *e)
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

void *ckpt_thread(void *arg)
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
