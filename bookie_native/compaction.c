/* bkspark bookie storage engine: compaction of entry logs. */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- compaction */
#define REPOINT_BATCH 1024 /* copied entries re-pointed per index batch (each holds off flushes) */
#define REPOINT_MAX_NS 20000000ull /* ... and at most this long looking them up */
#define REPOINT_LOOKUPS 256u /* ... looked up this many at a time, sorted (repoint_lookup) */
/* Test hook (eng_set_alloc_fail): every allocation of a pass is counted (alloc_count, reset when
 * the pass starts), and number alloc_fail_at returns NULL, so a test can fail each in turn.
 * compact_mu held. */
static int c_alloc_fails(Engine *e)
{
    e->alloc_count++;
    return e->alloc_fail_at && e->alloc_count == e->alloc_fail_at;
}
#define C_MALLOC(e, n) (c_alloc_fails(e) ? NULL : malloc(n))
#define C_CALLOC(e, n, sz) (c_alloc_fails(e) ? NULL : calloc((n), (sz)))
#define C_REALLOC(e, p, n) (c_alloc_fails(e) ? NULL : realloc((p), (n)))

uint32_t eng_set_alloc_fail(Engine *e, uint32_t n)
{
    pthread_mutex_lock(&e->compact_mu);
    uint32_t last = e->alloc_count;
    e->alloc_fail_at = n;
    pthread_mutex_unlock(&e->compact_mu);
    return last;
}

typedef struct {
    LogFile *lf;
    double ratio;
} Cand;

static int cand_cmp(const void *a, const void *b)
{
    const Cand *x = a, *y = b;
    return x->ratio < y->ratio ? -1 : x->ratio > y->ratio;
}

/* compaction's gathering: the live locations of one log (kv_scan_locs callback) */
typedef struct {
    Engine *e;
    LogFile *lf;
    WItem **w;
    LogFile ***srcs;
    size_t *wn, *wcap;
    uint64_t ledger;
    int oom;
} Gather;

static int gather_live(void *arg, const Loc *lc)
{
    Gather *g = arg;
    if (lc->where != g->lf->id)
        return 0; /* (a later copy elsewhere) */
    if (*g->wn == *g->wcap) {
        WItem *nw = C_REALLOC(g->e, *g->w, *g->wcap * 2 * sizeof **g->w);
        if (nw)
            *g->w = nw;
        LogFile **ns = nw ? C_REALLOC(g->e, *g->srcs, *g->wcap * 2 * sizeof **g->srcs) : NULL;
        if (ns)
            *g->srcs = ns;
        if (!nw || !ns) {
            g->oom = 1;
            return 1;
        }
        *g->wcap *= 2;
    }
    WItem *x = &(*g->w)[*g->wn];
    (*g->srcs)[(*g->wn)++] = g->lf;
    memset(x, 0, sizeof *x);
    x->ledger = g->ledger;
    x->entry = lc->entry;
    x->len = lc->len;
    x->off = lc->off;
    x->cache_off = g->lf->id; /* source log id */
    return 0;
}

/* the order of (ledger, entry) pairs: by ledger, then entry */
static int ledger_entry_cmp(uint64_t la, int64_t ea, uint64_t lb, int64_t eb)
{
    if (la != lb)
        return la < lb ? -1 : 1;
    return ea < eb ? -1 : ea > eb;
}

static int witem_loc_cmp(const void *a, const void *b)
{
    const WItem *x = a, *y = b;
    return ledger_entry_cmp(x->ledger, x->entry, y->ledger, y->entry);
}

typedef struct {
    uint64_t ledger;
    Loc loc;
} MovedLoc;

static int moved_cmp(const void *a, const void *b)
{
    const MovedLoc *x = a, *y = b;
    return ledger_entry_cmp(x->ledger, x->loc.entry, y->ledger, y->loc.entry);
}

#define COMPACT_CHUNK_BYTES (8u << 20) /* copied (read, written, synced) at most this much at a time */

/* a copied entry to look up, and where it is in the pass's list */
typedef struct {
    uint64_t ledger;
    int64_t entry;
    size_t k;
} LookupKey;

static int lookup_cmp(const void *a, const void *b)
{
    const LookupKey *x = a, *y = b;
    return ledger_entry_cmp(x->ledger, x->entry, y->ledger, y->entry);
}

/* Mark w[a..b) (b - a <= REPOINT_LOOKUPS) whose copy is to replace the original: copied, and the
 * index still points at the original (state 1; else 0).  The entries are looked up sorted, one
 * iterator a ledger (kv_get_locs; a point lookup each, ~5 us, held flushes off 1.5 s for 300,000
 * small entries: bench/repoint.py); those of a ledger deleted since they were copied are dead, not
 * looked up.  E_OK, or E_IO (a read error of the index). */
static int repoint_lookup(Engine *e, WItem *w, const int *copied, size_t a, size_t b)
{
    LookupKey keys[REPOINT_LOOKUPS];
    int64_t entries[REPOINT_LOOKUPS];
    Loc locs[REPOINT_LOOKUPS];
    int found[REPOINT_LOOKUPS];
    size_t n = 0;
    for (size_t k = a; k < b; k++) {
        w[k].state = 0;
        if (copied[k])
            keys[n++] = (LookupKey){w[k].ledger, w[k].entry, k};
    }
    qsort(keys, n, sizeof *keys, lookup_cmp);
    for (size_t s0 = 0, s1; s0 < n; s0 = s1) {
        for (s1 = s0; s1 < n && keys[s1].ledger == keys[s0].ledger; s1++)
            entries[s1 - s0] = keys[s1].entry;
        Ledger *l;
        pthread_mutex_lock(&e->mu);
        int lr = led_lookup(e, keys[s0].ledger, &l);
        pthread_mutex_unlock(&e->mu);
        if (lr != E_OK)
            return E_IO;
        if (!l)
            continue;
        if (kv_get_locs(e, keys[s0].ledger, entries, s1 - s0, locs, found) < 0)
            return E_IO;
        for (size_t j = s0; j < s1; j++) {
            const WItem *x = &w[keys[j].k];
            const Loc *cur = &locs[j - s0];
            if (found[j - s0] && cur->where == (uint32_t)x->cache_off && cur->off == x->off)
                w[keys[j].k].state = 1;
        }
    }
    return E_OK;
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
    e->alloc_count = 0;
    /* a flush first: its index batch applies the deletes made since the last one, so the live
     * bytes the candidates are chosen by count them */
    ckpt_lock_now(e);
    int frc = e->closed ? E_CLOSED : checkpoint_locked(e, 0, 0);
    pthread_mutex_unlock(&e->ckpt_mu);
    if (frc != E_OK) {
        pthread_mutex_unlock(&e->compact_mu);
        return frc;
    }
    pthread_mutex_lock(&e->mu);
    if (e->closing) { /* (set before closed) */
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_unlock(&e->compact_mu);
        return E_CLOSED;
    }
    Cand *cand = C_MALLOC(e, (e->nlogs + 1) * sizeof *cand);
    if (!cand) {
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_unlock(&e->compact_mu);
        seterr(e, "out of memory choosing the entry logs to compact");
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
    for (size_t c = 0; c < nsel; c++)
        cand[c].lf->refs++;
    pthread_mutex_unlock(&e->mu);
    /* gather the live entries of the selected logs: every record their .idx lists that the index
     * still points at (no lock: the index is read directly; what changes meanwhile is re-checked
     * before the re-point) */
    size_t wcap = 64, wn = 0;
    WItem *w = C_MALLOC(e, wcap * sizeof *w);
    LogFile **srcs = C_MALLOC(e, wcap * sizeof *srcs);
    /* Every allocation of a pass is checked: one that fails gives the pass up with an error
     * ("out of memory ..."), before the re-point -- nothing is re-pointed, nothing unlinked (copies
     * already written stay unreferenced, as when close aborts a pass).  oom: give the pass up
     * (nomem: for want of memory, else an index read error, whose message is set). */
    int nomem = !w || !srcs, oom = nomem; /* nothing is moved yet: the run is given up */
    for (size_t c = 0; c < nsel && !oom; c++) {
        LogFile *lf = cand[c].lf;
        if (lf->live == 0)
            continue;
        size_t isz = (size_t)lf->idx_size;
        unsigned char *ib = C_MALLOC(e, isz ? isz : 1);
        if (!ib) { /* (not "unreadable": the log would be skipped, and the pass go on without it) */
            nomem = oom = 1;
            break;
        }
        if (read_full(lf->idx_fd, ib, isz, 0) < 0)
            isz = 0; /* unreadable: its entries stay where they are, and so does the log */
        size_t from_wn = wn;
        Gather g = {e, lf, &w, &srcs, &wn, &wcap, 0, 0};
        for (size_t off = I_HDR; off + 8 <= isz && !oom;) {
            uint32_t cnt = get32(ib + off);
            size_t bl = (size_t)cnt * IR_SIZE;
            if (cnt == 0 || off + 8 + bl > isz ||
                get32(ib + off + 4) != bks_crc32c(bks_crc32c(0, ib + off, 4), ib + off + 8, bl))
                break;
            /* a block lists one flush's records in (ledger, entry) order: one index scan per
             * ledger of it, over its entry range, keeps the locations still in this log */
            for (uint32_t k = 0; k < cnt && !oom;) {
                const unsigned char *r = ib + off + 8 + (size_t)k * IR_SIZE;
                uint64_t ledger = get64(r);
                int64_t lo = (int64_t)get64(r + 8), hi = lo;
                for (k++; k < cnt && get64(ib + off + 8 + (size_t)k * IR_SIZE) == ledger; k++) {
                    int64_t en = (int64_t)get64(ib + off + 8 + (size_t)k * IR_SIZE + 8);
                    lo = en < lo ? en : lo;
                    hi = en > hi ? en : hi;
                }
                g.ledger = ledger;
                int gone = led_gone(e, ledger); /* (deleted: nothing of it is live) */
                if (gone == 1) {
                    cs->deleted_skipped++;
                    continue;
                }
                if (gone < 0 || kv_scan_locs(e, ledger, lo, hi, gather_live, &g) < 0 || g.oom)
                    oom = 1; /* (an index read error or no memory: give the pass up) */
                nomem |= g.oom;
            }
            off += 8 + bl;
        }
        free(ib);
        /* (an entry re-added into the same log is listed by two blocks: keep one) */
        qsort(w + from_wn, wn - from_wn, sizeof *w, witem_loc_cmp);
        size_t u = from_wn;
        for (size_t i = from_wn; i < wn; i++)
            if (u == from_wn || w[i].ledger != w[u - 1].ledger || w[i].entry != w[u - 1].entry)
                w[u++] = w[i];
        wn = u;
    }
    if (oom) {
        if (nomem)
            seterr(e, "out of memory gathering the live entries of %zu entry logs to compact", nsel);
        pthread_mutex_lock(&e->mu);
        for (size_t c = 0; c < nsel; c++)
            cand[c].lf->refs--;
        pthread_mutex_unlock(&e->mu);
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
    WItem *chunk = C_MALLOC(e, (wn ? wn : 1) * sizeof *chunk);
    size_t *chunk_idx = C_MALLOC(e, (wn ? wn : 1) * sizeof *chunk_idx);
    int *copied = C_CALLOC(e, wn ? wn : 1, sizeof *copied);
    LogFile **victims = C_MALLOC(e, (nsel ? nsel : 1) * sizeof *victims); /* (was a VLA: nsel is unbounded) */
    if (!chunk || !chunk_idx || !copied || !victims) {
        rc = E_IO;
        seterr(e, "out of memory for the compaction of %zu entries", wn);
    }
    size_t i = 0;
    while (i < wn && rc == E_OK) {
        size_t cn = 0;
        uint64_t cbytes = 0;
        for (; i < wn && (cn == 0 || cbytes + w[i].len <= COMPACT_CHUNK_BYTES); i++) {
            WItem *x = &w[i];
            unsigned char *body = C_MALLOC(e, x->len ? x->len : 1);
            if (!body) { /* (not a corrupt entry: the pass is given up) */
                rc = E_IO;
                seterr(e, "out of memory reading entry %llu:%lld for compaction", (unsigned long long)x->ledger,
                       (long long)x->entry);
                break;
            }
            Loc lc = {x->entry, srcs[i]->id, x->len, x->off};
            if (log_read(e, srcs[i], x->ledger, &lc, body) != E_OK) {
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
        if (cn && rc == E_OK)
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
    size_t nv = 0;
    /* re-point, in batches of REPOINT_BATCH copied entries: each batch (under ckpt_mu: no flush's
     * index batch meanwhile) moves the entries the index still points at the originals of, and
     * updates the live bytes, in one index batch; the last one also drops the rows of the logs
     * left empty and is synced (the index's log is one sequence: syncing it syncs the batches
     * before), and only then are those logs unlinked (a kill in between leaves files no row
     * lists, removed at the next open).  Between batches flushes run (the pass sleeps a moment
     * so a flush waiting for ckpt_mu gets it): one batch for the whole pass held them off for
     * seconds (hundreds of thousands of small entries looked up), the write cache filled and
     * adds waited (2026-12-07, bench/gc_stall.py).  A kill between batches leaves a prefix of
     * them: some entries pointing at their copies, the rest at the originals, both holding the
     * same bytes, the live counts (written with the locations) saying which are referenced. */
    for (size_t k0 = 0; k0 < wn || (k0 == 0 && rc == E_OK);) {
        size_t kmax = wn - k0 > REPOINT_BATCH ? k0 + REPOINT_BATCH : wn, k1 = k0;
        pthread_mutex_lock(&e->ckpt_mu);
        uint64_t repoint_t0 = now_ns();
        if (rc == E_OK) { /* a directory that failed meanwhile (here or in a flush) stops the pass */
            pthread_mutex_lock(&e->mu);
            rc = ldir_check(e, "compactions");
            pthread_mutex_unlock(&e->mu);
        }
        KvBatch *b = rc == E_OK ? kvb_new() : NULL;
        if (rc == E_OK && !b)
            rc = E_IO;
        /* which entries the index still points at the originals of, REPOINT_LOOKUPS at a time
         * (repoint_lookup); a batch ends after REPOINT_BATCH of them or REPOINT_MAX_NS, whichever
         * comes first (a lookup in a range a delete just dropped took ~2 ms: 2026-12-07) */
        while (k1 < kmax && rc == E_OK) {
            if (k1 > k0 && now_ns() - repoint_t0 > REPOINT_MAX_NS)
                break;
            size_t g1 = kmax - k1 > REPOINT_LOOKUPS ? k1 + REPOINT_LOOKUPS : kmax;
            rc = repoint_lookup(e, w, copied, k1, g1);
            k1 = g1;
        }
        int last = k1 == wn;
        /* the moved entries' new locations, per ledger in entry order, replacing (cutting) the
         * runs that held the originals */
        if (rc == E_OK) {
            MovedLoc *mv = C_MALLOC(e, (k1 - k0 ? k1 - k0 : 1) * sizeof *mv);
            size_t nm = 0;
            if (!mv) {
                rc = E_IO;
                seterr(e, "out of memory re-pointing %zu compacted entries", k1 - k0);
            }
            for (size_t k = k0; mv && k < k1; k++)
                if (w[k].state)
                    mv[nm++] = (MovedLoc){w[k].ledger, {w[k].entry, w[k].where, w[k].len, w[k].dst_off}};
            if (mv)
                qsort(mv, nm, sizeof *mv, moved_cmp);
            Loc *lv = mv ? C_MALLOC(e, (nm ? nm : 1) * sizeof *lv) : NULL;
            if (mv && !lv) {
                rc = E_IO;
                seterr(e, "out of memory re-pointing %zu compacted entries", nm);
            }
            for (size_t k = 0; lv && k < nm && rc == E_OK;) {
                size_t s0 = k, c = 0;
                for (; k < nm && mv[k].ledger == mv[s0].ledger; k++)
                    lv[c++] = mv[k].loc;
                if (kvb_put_locs(e, b, mv[s0].ledger, lv, c, 1, NULL, NULL) < 0)
                    rc = E_IO;
            }
            free(lv);
            free(mv);
        }
        if (rc == E_OK) {
            pthread_mutex_lock(&e->mu);
            for (size_t k = k0; k < k1; k++) {
                WItem *x = &w[k];
                if (!x->state)
                    continue;
                LogFile *dst = log_find(e, x->where);
                srcs[k]->live -= LR_HDR + x->len;
                srcs[k]->gdirty = 1;
                if (dst) {
                    dst->live += LR_HDR + x->len;
                    dst->gdirty = 1;
                }
                cs->entries_copied++;
                cs->bytes_copied += x->len;
            }
            for (size_t c = 0; c < ncreated; c++)
                created[c]->gdirty = 1;
            for (size_t c = 0; last && c < nsel; c++) {
                LogFile *lf = cand[c].lf;
                if (lf->live != 0)
                    continue; /* something still points here (a corrupt entry) */
                victims[nv++] = lf;
                lf->gdirty = 0;
                kvb_del_log(b, lf->id);
            }
            for (size_t i = 0; i < e->nlogs; i++) {
                LogFile *lf = e->logs[i];
                if (lf->gdirty) {
                    kvb_put_log(b, lf->id, lf->size, lf->idx_size, lf->live);
                    lf->gdirty = 0;
                }
            }
            pthread_mutex_unlock(&e->mu);
            rc = kvb_write(e, b, last);
            pthread_mutex_lock(&e->mu);
            if (rc == E_OK) {
                e->index_gen++;
                for (size_t v = 0; v < nv; v++) {
                    logs_remove(e, victims[v]);
                    victims[v]->dead = 1;
                }
            } else {
                if (!e->index_failed) /* (the live counts now disagree with the index: sticky, as a flush's) */
                    e->index_failed = EIO;
                nv = 0;
            }
            pthread_mutex_unlock(&e->mu);
        }
        kvb_free(b);
        TM_ADD(e, TM_C_REPOINT, now_ns() - repoint_t0);
        pthread_mutex_unlock(&e->ckpt_mu);
        if (rc != E_OK || last)
            break;
        k0 = k1;
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* (a flush waiting for ckpt_mu takes it) */
        pthread_mutex_lock(&e->mu);
        pause_point(e, "compaction-repointed"); /* (test hook: between two batches) */
        if (e->closing)
            rc = E_CLOSED; /* the batches written stand: the rest stays on the originals */
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&e->mu);
    for (size_t c = 0; c < nsel; c++) {
        int victim = 0;
        for (size_t v = 0; v < nv; v++)
            if (victims[v] == cand[c].lf)
                victim = 1;
        if (!victim) /* victims keep our reference until their files are gone */
            cand[c].lf->refs--;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc == E_OK) {
        for (size_t v = 0; v < nv; v++) {
            char p[4200];
            lpath(e, victims[v]->dir, victims[v]->id, "log", p, sizeof p);
            /* (removed from the list at its re-point: no new reader; one still reading keeps it
             * whole, unlinked at once) */
            pthread_mutex_lock(&e->mu);
            int alone = victims[v]->refs == 1;
            pthread_mutex_unlock(&e->mu);
            if (alone)
                unlink_gradually(e, p, "delete-cut");
            else
                unlink(p);
            lpath(e, victims[v]->dir, victims[v]->id, "idx", p, sizeof p);
            unlink(p);
            if (fsync_dir(e->ledger_dirs[victims[v]->dir]) < 0) /* (the files may come back: removed at the next open) */
                ldir_fail(e, victims[v]->dir, errno);
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
    free(victims);
    free(srcs);
    free(created);
    free(w);
    free(cand);
    pthread_mutex_unlock(&e->compact_mu);
    return rc;
}
