/* bkspark bookie storage engine: the ledger table and each ledger's entry locations (the in-memory index). */
#define _GNU_SOURCE
#include "engine_int.h"

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

Ledger *ledger_create(Engine *e, uint64_t id, uint64_t inc)
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

void ledger_remove(Engine *e, uint64_t id)
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

/* set the location of an entry (insert or replace); keeps log live-byte accounting */
int loc_set(Engine *e, Ledger *l, int64_t entry, uint32_t where, uint32_t len, uint64_t off)
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

/* ---------------------------------------------------------------- ledger accessors (engine.h; caller holds mu) */
int eng_ledger_info(Engine *e, uint64_t ledger, LedgerInfo *li)
{
    Ledger *l = eng_find(e, ledger);
    if (!l)
        return E_NOLEDGER;
    li->fenced = l->fenced;
    li->last = l->n ? l->locs[l->n - 1].entry : -1;
    li->has_key = l->has_key;
    li->key = l->key;
    li->keylen = l->keylen;
    li->has_lac = l->has_lac;
    li->lac = l->lac;
    li->laclen = l->laclen;
    return E_OK;
}

int eng_ledger_ranges(Engine *e, uint64_t ledger, int64_t **rgp, size_t *nrp)
{
    Ledger *l = eng_find(e, ledger);
    if (!l)
        return E_NOLEDGER;
    size_t nr = 0;
    int64_t *rg = malloc((l->n ? l->n : 1) * 2 * sizeof *rg);
    for (size_t i = 0; rg && i < l->n; i++) {
        int64_t x = l->locs[i].entry;
        if (nr && rg[2 * nr - 1] + 1 == x)
            rg[2 * nr - 1] = x;
        else {
            rg[2 * nr] = x;
            rg[2 * nr + 1] = x;
            nr++;
        }
    }
    *rgp = rg;
    *nrp = nr;
    return E_OK;
}

uint64_t *eng_ledger_ids(Engine *e, size_t *np)
{
    size_t n = 0;
    uint64_t *ids = malloc((e->nledgers ? e->nledgers : 1) * sizeof *ids);
    for (size_t s = 0; ids && s < e->nbuckets; s++)
        for (Ledger *l = e->buckets[s]; l; l = l->next)
            ids[n++] = l->id;
    *np = n;
    return ids;
}
