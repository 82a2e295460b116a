/* bkspark bookie storage engine: the state file, LastLogMark, journal gc and the checkpoint (flush) thread. */
#define _GNU_SOURCE
#include "engine_int.h"

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

int write_state(Engine *e)
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
uint64_t *list_journals(Engine *e, size_t *n)
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
int checkpoint_locked(Engine *e, int full, int paced)
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
