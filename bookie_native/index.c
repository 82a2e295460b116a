/* bkspark bookie storage engine: the ledger cache (the in-memory part of the index) and the entry
 * logs' table.
 *
 * The ledger cache.  The on-disk index (kv.c) holds every ledger's record and every flushed entry's
 * location.  Memory holds a Ledger only while it is needed: it is *pinned* while it has entries in
 * the write cache (their locations live only here until a flush re-points them into the index),
 * while its record has changes the index has not received (dirty), or while it is a tombstone (a
 * delete the index has not applied).  Unpinned ledgers stay as a cache of recently used ones, at
 * most ledger_cache_max of them, least recently used evicted first.  So memory grows with the
 * ledgers being written, not with the ledgers stored.  Everything here runs under mu.
 *
 * Why a lookup that misses goes to the index under mu: a miss is a ledger not used lately (a
 * writer keeps its ledger pinned, a reader's stays cached); the Get is served from RocksDB's block
 * cache or one SST block read, and doing it under mu keeps the rule "memory, if present, is newer
 * than the index" trivially true (a batch that changes a ledger's record is built from memory). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- hash table + LRU */
static size_t hslot(Engine *e, uint64_t id)
{
    uint64_t h = id * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (e->nbuckets - 1);
}

Ledger *led_mem(Engine *e, uint64_t id)
{
    for (Ledger *l = e->buckets[hslot(e, id)]; l; l = l->next)
        if (l->id == id)
            return l;
    return NULL;
}

static void lru_unlink(Engine *e, Ledger *l)
{
    if (l->lru_prev)
        l->lru_prev->lru_next = l->lru_next;
    else
        e->lru_head = l->lru_next;
    if (l->lru_next)
        l->lru_next->lru_prev = l->lru_prev;
    else
        e->lru_tail = l->lru_prev;
    l->lru_prev = l->lru_next = NULL;
}

static void lru_front(Engine *e, Ledger *l)
{
    l->lru_next = e->lru_head;
    l->lru_prev = NULL;
    if (e->lru_head)
        e->lru_head->lru_prev = l;
    e->lru_head = l;
    if (!e->lru_tail)
        e->lru_tail = l;
}

static void touch(Engine *e, Ledger *l)
{
    if (e->lru_head != l) {
        lru_unlink(e, l);
        lru_front(e, l);
    }
}

static int grow_buckets(Engine *e)
{
    size_t nb = e->nbuckets * 2;
    Ledger **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return -1;
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
    return 0;
}

static void insert(Engine *e, Ledger *l)
{
    if (e->nledgers + 1 > e->nbuckets)
        grow_buckets(e); /* (a failure only lengthens the chains) */
    size_t s = hslot(e, l->id);
    l->next = e->buckets[s];
    e->buckets[s] = l;
    e->nledgers++;
    lru_front(e, l);
}

static void clear_meta(Ledger *l)
{
    free(l->key);
    free(l->lac);
    l->key = l->lac = NULL;
    l->keylen = 0;
    l->laclen = 0;
    l->has_key = l->fenced = l->has_lac = 0;
}

void led_free(Engine *e, Ledger *l)
{
    Ledger **pp = &e->buckets[hslot(e, l->id)];
    while (*pp && *pp != l)
        pp = &(*pp)->next;
    if (*pp)
        *pp = l->next;
    lru_unlink(e, l);
    clear_meta(l);
    free(l->locs);
    free(l);
    e->nledgers--;
}

static int pinned(const Ledger *l) { return l->n || l->dirty || l->deleted || l->purge || l->inflight; }

/* Evict least recently used unpinned ledgers beyond ledger_cache_max, walking at most `steps` from
 * the tail (pinned ones are skipped: at most as many as ledgers being written).  A lookup walks a
 * few; an index batch, which unpins the ledgers it wrote, walks as far as it takes. */
void led_evict(Engine *e, size_t steps)
{
    Ledger *l = e->lru_tail;
    for (; l && e->nledgers > e->ledger_cache_max && steps > 0; steps--) {
        Ledger *prev = l->lru_prev;
        if (!pinned(l))
            led_free(e, l);
        l = prev;
    }
}

void led_free_all(Engine *e)
{
    for (size_t s = 0; s < e->nbuckets; s++) {
        Ledger *l = e->buckets[s];
        while (l) {
            Ledger *nx = l->next;
            clear_meta(l);
            free(l->locs);
            free(l);
            l = nx;
        }
        e->buckets[s] = NULL;
    }
    e->nledgers = 0;
    e->lru_head = e->lru_tail = NULL;
}

/* ---------------------------------------------------------------- lookups and changes */
int led_lookup(Engine *e, uint64_t id, Ledger **out)
{
    *out = NULL;
    Ledger *l = led_mem(e, id);
    if (l) {
        if (!l->deleted) {
            touch(e, l);
            *out = l;
        }
        return E_OK;
    }
    l = calloc(1, sizeof *l);
    if (!l) {
        seterr(e, "out of memory");
        return E_IO;
    }
    l->id = id;
    int r = kv_get_ledger(e, id, l);
    if (r == 1)
        r = kv_last_entry(e, id, &l->flushed_last) < 0 ? -1 : 1;
    if (r != 1) {
        clear_meta(l);
        free(l);
        return r < 0 ? E_IO : E_OK;
    }
    led_evict(e, 64); /* (before the insert: never the ledger being returned) */
    insert(e, l);
    *out = l;
    return E_OK;
}

/* led_lookup for a caller that reports the answer: a ledger is reported absent only once its
 * delete is durable.  A DELETE_LEDGER record not yet synced leaves the ledger a tombstone in memory
 * -- or already removed from the index, when a flush's batch took the tombstone first -- and a kill
 * -9 before the record's sync brings the ledger back (replay re-creates it from its records after
 * the mark).  So when no ledger is found while a DELETE record of its journal is unsynced
 * (del_seq: the last one queued; an unrelated ledger's delete makes this wait too, which is rare
 * and short), this waits for that record's sync -- committing it on this thread when no commit
 * runs -- and looks again.  mu is released while waiting.  A failed journal cannot tell whether
 * the record reached the disk: then a delete queued since the open makes it E_IO. */
int led_lookup_durable(Engine *e, uint64_t id, Ledger **out)
{
    Journal *j = led_journal(e, id);
    for (;;) {
        int rc = led_lookup(e, id, out);
        if (rc != E_OK || *out || j->del_seq == 0 || (!j->j_failed && j->del_seq <= j->j_synced))
            return rc;
        if (j_wait(j, j->del_seq) != E_OK) /* (E_IO at once if the journal has failed) */
            return E_IO;
    }
}

/* Whether no location of ledger `id` can be live: it is deleted in memory (its purge not flushed
 * yet), or neither memory nor the index knows it -- a delete's flush removes the ledger's record
 * and all its locations in one batch, and a flush never writes a ledger's locations without its
 * record, so an index without the record holds none of its locations.  Compaction's gather skips
 * such a ledger instead of scanning its range: right after a retention cut that range is under
 * the delete's range tombstone, and each seek into it walked back over every covered key (over
 * half of the collector's CPU samples under bench/gc_stall.py, perf, 2026-12-07).  A ledger created again after
 * the look is new: its entries go to logs no pass has chosen yet.  Takes mu; returns 1 gone, 0
 * not, -1 on an index read error (set). */
int led_gone(Engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    Ledger *l = led_mem(e, id);
    int known = l != NULL, deleted = l && l->deleted;
    pthread_mutex_unlock(&e->mu);
    if (known)
        return deleted;
    int r = kv_has_ledger(e, id);
    return r < 0 ? -1 : r == 0;
}

void led_dirty(Engine *e, Ledger *l)
{
    if (l->dirty)
        return;
    if (e->ndirty == e->dirtycap) {
        size_t nc = e->dirtycap ? e->dirtycap * 2 : 256;
        uint64_t *p = realloc(e->dirty, nc * sizeof *p);
        if (!p) { /* the next batch walks the whole cache instead (see collect_dirty) */
            e->ndirty = SIZE_MAX;
            l->dirty = 1;
            return;
        }
        e->dirty = p;
        e->dirtycap = nc;
    }
    if (e->ndirty != SIZE_MAX)
        e->dirty[e->ndirty++] = l->id;
    l->dirty = 1;
}

Ledger *led_create(Engine *e, uint64_t id, uint64_t inc)
{
    if (!inc)
        inc = e->next_inc;
    if (inc >= e->next_inc)
        e->next_inc = inc + 1;
    Ledger *l = led_mem(e, id);
    if (l) { /* a tombstone: re-created before the index applied the delete (purge stays set) */
        l->deleted = 0;
        l->inc = inc;
        l->flushed_last = -1;
        touch(e, l);
    } else {
        l = calloc(1, sizeof *l);
        if (!l)
            return NULL;
        l->id = id;
        l->inc = inc;
        l->flushed_last = -1;
        insert(e, l);
    }
    led_dirty(e, l);
    return l;
}

/* Delete: a tombstone until the next index batch removes the record and every location. */
void led_delete(Engine *e, Ledger *l)
{
    clear_meta(l);
    free(l->locs);
    l->locs = NULL;
    l->n = l->cap = 0;
    l->deleted = 1;
    l->purge = 1;
    l->purge_seq++;
    l->flushed_last = -1;
    led_dirty(e, l);
}

int led_set_key(Ledger *l, const unsigned char *key, uint32_t keylen)
{
    unsigned char *k = malloc(keylen ? keylen : 1);
    if (!k)
        return -1;
    memcpy(k, key, keylen);
    free(l->key);
    l->key = k;
    l->keylen = (uint16_t)keylen;
    l->has_key = 1;
    return 0;
}

/* ---------------------------------------------------------------- entry logs table */
LogFile *log_find(Engine *e, uint32_t id)
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

void log_release(LogFile *lf)
{
    if (lf->dfd >= 0)
        close(lf->dfd);
    if (lf->fd >= 0)
        close(lf->fd);
    if (lf->idx_fd >= 0)
        close(lf->idx_fd);
    free(lf);
}

/* ---------------------------------------------------------------- write-cache locations of a ledger */
/* index of the first loc with entry >= id */
size_t loc_lower(Ledger *l, int64_t id)
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

Loc *loc_get(Ledger *l, int64_t id)
{
    size_t i = loc_lower(l, id);
    if (i < l->n && l->locs[i].entry == id)
        return &l->locs[i];
    return NULL;
}

/* loc_get with a cursor: consecutive lookups of increasing entries of one ledger are O(1) */
Loc *loc_get_hint(Ledger *l, int64_t id, size_t *hint)
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

/* set the write-cache location of an entry (insert or replace) */
int loc_set(Ledger *l, int64_t entry, uint32_t where, uint32_t len, uint64_t off)
{
    size_t i = loc_lower(l, entry);
    if (!(i < l->n && l->locs[i].entry == entry)) {
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
    return 0;
}

/* remove the locations marked WHERE_DROPPED (one pass) */
void loc_compact(Ledger *l)
{
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->locs[i].where != WHERE_DROPPED)
            l->locs[k++] = l->locs[i];
    l->n = k;
    if (l->n == 0) { /* a flushed ledger keeps no array */
        free(l->locs);
        l->locs = NULL;
        l->cap = 0;
    }
}

/* ---------------------------------------------------------------- ledger accessors (engine.h) */
int eng_ledger_info(Engine *e, uint64_t ledger, LedgerInfo *li)
{
    Ledger *l;
    int rc = led_lookup_durable(e, ledger, &l); /* (absent only once its delete is durable) */
    if (rc != E_OK)
        return rc;
    if (!l)
        return E_NOLEDGER;
    li->fenced = l->fenced;
    int64_t clast = l->n ? l->locs[l->n - 1].entry : -1, flast = l->purge ? -1 : l->flushed_last;
    li->last = clast > flast ? clast : flast;
    li->has_key = l->has_key;
    li->key = l->key;
    li->keylen = l->keylen;
    li->has_lac = l->has_lac;
    li->lac = l->lac;
    li->laclen = l->laclen;
    return E_OK;
}

/* a growing list of entry intervals [first, last] */
typedef struct {
    int64_t (*v)[2];
    size_t n, cap;
} Spans;

/* append [first, last]; extends the last interval when it continues it */
static int span_push(Spans *a, int64_t first, int64_t last)
{
    if (a->n && a->v[a->n - 1][1] + 1 == first) {
        a->v[a->n - 1][1] = last;
        return 0;
    }
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int64_t(*p)[2] = realloc(a->v, nc * sizeof *p);
        if (!p)
            return -1;
        a->v = p;
        a->cap = nc;
    }
    a->v[a->n][0] = first;
    a->v[a->n][1] = last;
    a->n++;
    return 0;
}

static int push_run(void *arg, int64_t first, int64_t last) { return span_push(arg, first, last) < 0; }

static int spancmp(const void *a, const void *b)
{
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* The ledger's entries as ranges: the write cache's (under mu), then the index's runs -- in this
 * order, so an entry a flush moves meanwhile is seen at least once (a flush writes the index
 * before it drops the cache location).  Cost: one step per cached entry and per run, not per
 * indexed entry. */
int eng_ledger_ranges(Engine *e, uint64_t ledger, int64_t **rgp, size_t *nrp)
{
    *rgp = NULL;
    *nrp = 0;
    Spans a = {0};
    pthread_mutex_lock(&e->mu);
    Ledger *l;
    int rc = e->closed ? E_CLOSED : led_lookup_durable(e, ledger, &l);
    if (rc == E_OK && !l)
        rc = E_NOLEDGER;
    int disk = 0;
    if (rc == E_OK) {
        disk = !l->purge && l->flushed_last >= 0;
        for (size_t i = 0; i < l->n && rc == E_OK; i++)
            if (span_push(&a, l->locs[i].entry, l->locs[i].entry) < 0)
                rc = E_IO;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc == E_OK && disk && kv_scan_runs(e, ledger, push_run, &a) < 0)
        rc = E_IO;
    if (rc != E_OK) {
        free(a.v);
        return rc;
    }
    qsort(a.v, a.n, sizeof *a.v, spancmp);
    size_t nr = 0;
    int64_t *rg = malloc((a.n ? a.n : 1) * 2 * sizeof *rg);
    for (size_t i = 0; rg && i < a.n; i++) {
        int64_t x = a.v[i][0], y = a.v[i][1];
        if (nr && rg[2 * nr - 1] + 1 >= x) { /* overlaps (in both) or continues the last range */
            if (y > rg[2 * nr - 1])
                rg[2 * nr - 1] = y;
        } else {
            rg[2 * nr] = x;
            rg[2 * nr + 1] = y;
            nr++;
        }
    }
    free(a.v);
    *rgp = rg;
    *nrp = nr;
    return rg ? E_OK : E_IO;
}

static int u64cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every ledger: the index's, plus those only in memory so far, minus tombstones (ascending).
 * Returns only once every delete it may leave out is durable: a ledger is missing from the list
 * because of a tombstone or of a batch that removed it from the index, both the work of a delete
 * queued before the scan ended, so waiting (after the scan) for each journal's last DELETE record
 * covers them (led_lookup_durable's rule). */
static int deletes_durable(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    int rc = E_OK;
    for (int k = 0; k < e->njournals && rc == E_OK; k++) {
        Journal *j = e->jn[k];
        if (j->del_seq && (j->j_failed || j->del_seq > j->j_synced))
            rc = j_wait(j, j->del_seq);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

uint64_t *eng_ledger_ids(Engine *e, size_t *np)
{
    *np = 0;
    uint64_t *mem = NULL, *gone = NULL, *ids = NULL;
    size_t nm = 0, ng = 0, n = 0;
    pthread_mutex_lock(&e->mu);
    mem = malloc((e->nledgers + 1) * sizeof *mem);
    gone = malloc((e->nledgers + 1) * sizeof *gone);
    for (size_t s = 0; mem && gone && s < e->nbuckets; s++)
        for (Ledger *l = e->buckets[s]; l; l = l->next) {
            if (l->deleted)
                gone[ng++] = l->id;
            else
                mem[nm++] = l->id;
        }
    pthread_mutex_unlock(&e->mu);
    if (!mem || !gone || kv_ledger_ids(e, &ids, &n) < 0 || deletes_durable(e) != E_OK) {
        free(mem);
        free(gone);
        free(ids);
        return NULL;
    }
    uint64_t *all = realloc(ids, (n + nm + 1) * sizeof *all);
    if (!all) {
        free(mem);
        free(gone);
        free(ids);
        return NULL;
    }
    memcpy(all + n, mem, nm * sizeof *all);
    n += nm;
    qsort(all, n, sizeof *all, u64cmp);
    qsort(gone, ng, sizeof *gone, u64cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((k && all[k - 1] == all[i]) || bsearch(&all[i], gone, ng, sizeof *gone, u64cmp))
            continue;
        all[k++] = all[i];
    }
    free(mem);
    free(gone);
    *np = k;
    return all;
}
