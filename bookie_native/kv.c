/* bkspark bookie storage engine: the on-disk index -- entry locations, the ledger index and the entry-log
 * table in RocksDB (README.md "The index"), through RocksDB's C API.
 *
 * Keys (big-endian numbers, so that one ledger's entries are adjacent and in entry order):
 *   'E' u64 ledger  u64 entry  -> u32 log id · u32 count|form · u64 offset · lengths (a run of locations)
 *   'L' u64 ledger             -> u64 incarnation · u8 flags · u16 keylen · key · u32 laclen · lac
 *   'G' u32 log id             -> u64 log size · u64 .idx size · u64 live bytes            (entry-log table)
 *   'M' name                   -> "format" (u32) / "next_inc" (u64)
 * Values are little-endian.  Every change is a write batch (atomic); flushes write theirs without
 * syncing the WAL, and kv_sync (before any LastLogMark moves past what they cover) and compaction
 * (before it unlinks the logs it emptied) make everything written so far durable. */
#define _GNU_SOURCE
#include <rocksdb/c.h> /* (before engine_int.h: its declarations stay out of iofault.h's macros) */
#include "engine_int.h"

struct Kv {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_block_based_table_options_t *topts;
    rocksdb_cache_t *cache;
    rocksdb_filterpolicy_t *bloom; /* owned by topts once set */
    rocksdb_readoptions_t *ro;
    rocksdb_writeoptions_t *wo, *wo_sync;
};

static inline void be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}
static inline uint64_t unbe64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void ekey(unsigned char k[KV_EKEY], uint64_t ledger, int64_t entry)
{
    k[0] = 'E';
    be64(k + 1, ledger);
    be64(k + 9, (uint64_t)entry);
}

static void lkey(unsigned char k[9], uint64_t ledger)
{
    k[0] = 'L';
    be64(k + 1, ledger);
}

static void gkey(unsigned char k[5], uint32_t id)
{
    k[0] = 'G';
    k[1] = (unsigned char)(id >> 24);
    k[2] = (unsigned char)(id >> 16);
    k[3] = (unsigned char)(id >> 8);
    k[4] = (unsigned char)id;
}

/* A write or sync of the index failed: sticky (index_failed holds the errno, counted for
 * ledger_dirs[0], which holds the index: README "Disk errors"); RocksDB says why only in words. */
static void kv_write_failed(Engine *e, const char *err)
{
    int code = err && strstr(err, "No space left") ? ENOSPC : err && strstr(err, "quota") ? EDQUOT : EIO;
    pthread_mutex_lock(&e->mu);
    if (!e->index_failed)
        e->index_failed = code;
    pthread_mutex_unlock(&e->mu);
}

static int kv_fail(Engine *e, const char *what, char *err)
{
    seterr(e, "ledger index (RocksDB) %s failed: %s", what, err ? err : "unknown error");
    rocksdb_free(err);
    return -1;
}

int kv_open(Engine *e, const char *path, int create, Kv **out)
{
    *out = NULL;
    Kv *kv = calloc(1, sizeof *kv);
    if (!kv) {
        seterr(e, "out of memory opening the ledger index");
        return E_IO;
    }
    kv->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(kv->opts, create);
    rocksdb_options_set_paranoid_checks(kv->opts, 1);
    rocksdb_options_set_compression(kv->opts, rocksdb_lz4_compression);
    /* memory: block cache (index_cache_bytes, which also holds the SST index and filter blocks)
     * + two memtables of index_memtable_bytes; disk: the WAL is held to four memtables (beyond,
     * RocksDB flushes the memtable the oldest WAL file covers); the info log is small and rotated */
    rocksdb_options_set_write_buffer_size(kv->opts, e->index_memtable_bytes);
    rocksdb_options_set_max_write_buffer_number(kv->opts, 2);
    rocksdb_options_set_max_total_wal_size(kv->opts, 4 * e->index_memtable_bytes);
    rocksdb_options_set_max_open_files(kv->opts, 512);
    rocksdb_options_set_max_background_jobs(kv->opts, 2);
    rocksdb_options_set_info_log_level(kv->opts, 2 /* WARN */);
    rocksdb_options_set_max_log_file_size(kv->opts, 1 << 20);
    rocksdb_options_set_keep_log_file_num(kv->opts, 2);
    rocksdb_options_set_recycle_log_file_num(kv->opts, 0);
    /* a torn tail (a batch a crash interrupted, never synced) is cut; damage anywhere else refuses
     * startup (point-in-time recovery would silently drop every batch after it -- acknowledged
     * entries whose journal the mark has passed) */
    rocksdb_options_set_wal_recovery_mode(kv->opts, 0 /* tolerate corrupted tail records */);
    kv->topts = rocksdb_block_based_options_create();
    kv->cache = rocksdb_cache_create_lru(e->index_cache_bytes);
    rocksdb_block_based_options_set_block_cache(kv->topts, kv->cache);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(kv->topts, 1);
    rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(kv->topts, 1);
    /* partitioned index and filters: a lookup loads one 4 KiB partition, not the index of a whole
     * SST (~400 KB for 64 MB of 4 KiB blocks), so a small cache serves a large index; the top
     * level stays pinned */
    rocksdb_block_based_options_set_index_type(kv->topts, rocksdb_block_based_table_index_type_two_level_index_search);
    rocksdb_block_based_options_set_partition_filters(kv->topts, 1);
    rocksdb_block_based_options_set_metadata_block_size(kv->topts, 4096);
    rocksdb_block_based_options_set_pin_top_level_index_and_filter(kv->topts, 1);
    /* bloom filters spare the lookups of keys that are not there (a new ledger's record) a block
     * read per level; none on the last level, which holds most keys and is where the lookups of
     * keys that are there end: a filter there would cost ~10 bits a stored entry of cache */
    kv->bloom = rocksdb_filterpolicy_create_bloom_full(10);
    rocksdb_block_based_options_set_filter_policy(kv->topts, kv->bloom);
    rocksdb_options_set_optimize_filters_for_hits(kv->opts, 1);
    rocksdb_options_set_block_based_table_factory(kv->opts, kv->topts);
    kv->ro = rocksdb_readoptions_create();
    kv->wo = rocksdb_writeoptions_create();
    kv->wo_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(kv->wo_sync, 1);
    char *err = NULL;
    kv->db = rocksdb_open(kv->opts, path, &err);
    if (err) {
        seterr(e, "cannot open the ledger index %s: %s; refusing to start (it holds the entry locations and the "
                  "fences: restore the directory, or decommission this bookie so that its ledgers are "
                  "re-replicated)", path, err);
        rocksdb_free(err);
        kv->db = NULL;
        kv_close(kv);
        return E_IO;
    }
    *out = kv;
    return E_OK;
}

void kv_close(Kv *kv)
{
    if (!kv)
        return;
    if (kv->db)
        rocksdb_close(kv->db);
    if (kv->ro)
        rocksdb_readoptions_destroy(kv->ro);
    if (kv->wo)
        rocksdb_writeoptions_destroy(kv->wo);
    if (kv->wo_sync)
        rocksdb_writeoptions_destroy(kv->wo_sync);
    if (kv->opts)
        rocksdb_options_destroy(kv->opts);
    if (kv->topts)
        rocksdb_block_based_options_destroy(kv->topts); /* (frees the filter policy) */
    if (kv->cache)
        rocksdb_cache_destroy(kv->cache);
    free(kv);
}

int kv_destroy(Engine *e, const char *path)
{
    rocksdb_options_t *o = rocksdb_options_create();
    char *err = NULL;
    rocksdb_destroy_db(o, path, &err);
    rocksdb_options_destroy(o);
    if (err)
        return kv_fail(e, "removal of a partial conversion", err), E_IO;
    return E_OK;
}

uint64_t kv_memory(Kv *kv)
{
    return kv && kv->cache ? (uint64_t)rocksdb_cache_get_usage(kv->cache) : 0;
}

/* ---------------------------------------------------------------- reads (no engine lock needed) */
static int kv_get(Engine *e, const unsigned char *k, size_t kl, unsigned char *v, size_t vcap, size_t *vlen,
                  unsigned char **vbig)
{
    char *err = NULL;
    rocksdb_pinnableslice_t *s = rocksdb_get_pinned(e->kv->db, e->kv->ro, (const char *)k, kl, &err);
    if (err)
        return kv_fail(e, "read", err);
    if (!s)
        return 0;
    size_t n;
    const char *p = rocksdb_pinnableslice_value(s, &n);
    *vlen = n;
    if (vbig) {
        *vbig = malloc(n ? n : 1);
        if (*vbig)
            memcpy(*vbig, p, n);
    } else {
        memcpy(v, p, n < vcap ? n : vcap);
    }
    rocksdb_pinnableslice_destroy(s);
    if (vbig && !*vbig) {
        seterr(e, "out of memory reading the ledger index");
        return -1;
    }
    return 1;
}



/* whether the index holds ledger `ledger`'s record: 1, 0, or -1 on a read error (set) */
int kv_has_ledger(Engine *e, uint64_t ledger)
{
    unsigned char k[9], v[1];
    size_t n = 0;
    lkey(k, ledger);
    return kv_get(e, k, sizeof k, v, 0, &n, NULL);
}

int kv_get_ledger(Engine *e, uint64_t ledger, Ledger *l)
{
    unsigned char k[9], *v = NULL;
    size_t n = 0;
    lkey(k, ledger);
    int r = kv_get(e, k, sizeof k, NULL, 0, &n, &v);
    if (r != 1)
        return r;
    const unsigned char *q = v, *end = v + n;
    if (n < 15)
        goto bad;
    l->inc = get64(q);
    unsigned flags = q[8];
    uint16_t kl;
    memcpy(&kl, q + 9, 2);
    q += 11;
    if (kl > MAX_KEY || end - q < kl + 4)
        goto bad;
    l->has_key = flags & 1;
    l->fenced = (flags & 2) != 0;
    l->keylen = kl;
    l->key = malloc(kl ? kl : 1);
    if (!l->key)
        goto oom;
    memcpy(l->key, q, kl);
    q += kl;
    uint32_t ll = get32(q);
    q += 4;
    if ((size_t)(end - q) != ll)
        goto bad;
    if (flags & 4) {
        l->lac = malloc(ll ? ll : 1);
        if (!l->lac)
            goto oom;
        memcpy(l->lac, q, ll);
        l->laclen = ll;
        l->has_lac = 1;
    }
    free(v);
    return 1;
bad:
    free(v);
    seterr(e, "ledger index: malformed record of ledger %llu", (unsigned long long)ledger);
    return -1;
oom:
    free(v);
    seterr(e, "out of memory reading the ledger index");
    return -1;
}

/* an iterator over [lo, hi) (hi: copied, must outlive it -- kept in *hib) */
static rocksdb_iterator_t *kv_iter(Engine *e, const unsigned char *hi, size_t hl, rocksdb_readoptions_t **ro)
{
    *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(*ro, (const char *)hi, hl);
    rocksdb_readoptions_set_fill_cache(*ro, 1);
    return rocksdb_create_iterator(e->kv->db, *ro);
}

static int kv_iter_end(Engine *e, rocksdb_iterator_t *it, rocksdb_readoptions_t *ro)
{
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    if (err)
        return kv_fail(e, "scan", err);
    return 0;
}



/* ---------------------------------------------------------------- entry locations, as runs
 * A location record covers a *run*: entries first..first+count-1 of one ledger written back to back
 * into one entry log (as a flush writes a ledger's consecutive entries); entry first+i is at
 * offset + sum over j < i of (24 + length j).  Value: u32 log id · u32 count | form · u64 offset of
 * the first record · the body lengths, in one of three forms:
 *   RUN_UNIFORM  one u32: every entry of the run has that length (fixed-size records);
 *   RUN_VARINT   count LEB128 varints (1 byte below 128, 2 below 16 KiB, 3 below 2 MiB);
 *   neither      count u32 (written by the first releases of this format; still read).
 * So the index of 100-byte entries costs ~0.05 byte per entry before compression, and the
 * records a reader needs stay in the block cache.  A flush writes one record per run (at most
 * RUN_MAX entries).  The runs of a ledger never overlap: writing entries that may already be
 * indexed (a re-add, a compaction's move) first cuts them out of the runs covering them
 * (kvb_put_locs).  So the run covering entry x, if any, is the last one starting at or before x. */
#define RUN_MAX 512u
#define RUN_HDR 16u
#define RUN_UNIFORM 0x80000000u
#define RUN_VARINT 0x40000000u
#define RUN_COUNT 0x3fffffffu
#define VARINT_MAX 5u /* bytes of a u32 */

typedef struct {
    int64_t first;
    uint32_t where, count, form; /* form: RUN_UNIFORM, RUN_VARINT or 0 (u32 lengths) */
    uint64_t off;
    const unsigned char *lens, *end;
} Run;

/* a forward cursor over a run's locations: entry first+pos is at off; p: its length's bytes */
typedef struct {
    uint32_t pos;
    uint64_t off;
    const unsigned char *p;
} RunCursor;

/* one LEB128 u32 at *p (before end); 0 if malformed */
static int varint_get(const unsigned char **p, const unsigned char *end, uint32_t *v)
{
    uint32_t x = 0;
    for (unsigned sh = 0; *p < end && sh < 7 * VARINT_MAX; sh += 7) {
        unsigned char c = *(*p)++;
        x |= (uint32_t)(c & 0x7f) << sh;
        if (!(c & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

static size_t varint_put(unsigned char *p, uint32_t v)
{
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        p[n++] = (unsigned char)(v | 0x80);
    p[n++] = (unsigned char)v;
    return n;
}

/* Decode a location record of `ledger`: 1 if it is a well-formed run, 0 if not.  No writer ever
 * made a run of more than RUN_MAX entries, and the readers rely on it (kvb_put_locs cuts a run
 * into a RUN_MAX buffer), so a larger count -- 2^30 - 1 fits the field of a uniform run, whose
 * value has no per-entry bytes to contradict it -- is malformed, as is a run reaching past the
 * largest entry id. */
static int run_decode(const unsigned char *k, size_t kl, const unsigned char *v, size_t vl, uint64_t ledger, Run *r)
{
    if (kl != KV_EKEY || k[0] != 'E' || unbe64(k + 1) != ledger || vl < RUN_HDR)
        return 0;
    uint32_t c = get32(v + 4);
    r->first = (int64_t)unbe64(k + 9);
    r->where = get32(v);
    r->count = c & RUN_COUNT;
    r->form = c & (RUN_UNIFORM | RUN_VARINT);
    r->off = get64(v + 8);
    r->lens = v + RUN_HDR;
    r->end = v + vl;
    if (r->count < 1 || r->count > RUN_MAX || r->first < 0 || r->first - 1 > INT64_MAX - (int64_t)r->count)
        return 0;
    if (r->form == RUN_UNIFORM)
        return vl == RUN_HDR + 4;
    if (r->form == 0)
        return vl == RUN_HDR + 4ull * r->count;
    if (r->form != RUN_VARINT)
        return 0;
    const unsigned char *p = r->lens; /* every length well-formed and nothing after the last */
    for (uint32_t i = 0, x; i < r->count; i++)
        if (!varint_get(&p, r->end, &x))
            return 0;
    return p == r->end;
}

static void run_cursor(const Run *r, RunCursor *c)
{
    c->pos = 0;
    c->off = r->off;
    c->p = r->lens;
}

/* length of the entry at the cursor (the run is well-formed: run_decode checked it) */
static uint32_t run_len_at(const Run *r, const RunCursor *c)
{
    if (r->form == RUN_UNIFORM)
        return get32(r->lens);
    if (r->form == 0)
        return get32(r->lens + 4ull * c->pos);
    const unsigned char *p = c->p;
    uint32_t x = 0;
    varint_get(&p, r->end, &x);
    return x;
}

/* location of entry first+i of the run, moving the cursor forward to it (i >= c->pos), so a walk
 * over the run is linear and a fixed-size run is reached in one step */
static void run_loc(const Run *r, uint32_t i, RunCursor *c, Loc *out)
{
    if (r->form == RUN_UNIFORM) {
        c->off += (uint64_t)(i - c->pos) * (LR_HDR + get32(r->lens));
        c->pos = i;
    }
    while (c->pos < i) {
        uint32_t len = 0;
        if (r->form == RUN_VARINT)
            varint_get(&c->p, r->end, &len);
        else
            len = run_len_at(r, c);
        c->off += LR_HDR + len;
        c->pos++;
    }
    out->entry = r->first + i;
    out->where = r->where;
    out->off = c->off;
    out->len = run_len_at(r, c);
}

/* A location record of `ledger` that run_decode refuses is damage: an error that names it (the
 * read or batch that meets it fails with EIO -- never "no such entry" for an entry the index
 * holds, never a record skipped so that a batch's cut or re-point misses it).  Returns -1. */
static int run_malformed(Engine *e, uint64_t ledger, const unsigned char *k, size_t kl)
{
    seterr(e, "ledger index: malformed location record of ledger %llu at entry %lld (corrupt index)",
           (unsigned long long)ledger, kl == KV_EKEY ? (long long)unbe64(k + 9) : -1LL);
    return -1;
}

/* the record at the iterator, one of `ledger`'s (ledger_iter's bounds keep the iterator within
 * its location records): 1 decoded into *r, -1 malformed (the error is set) */
static int run_at(Engine *e, rocksdb_iterator_t *it, uint64_t ledger, Run *r)
{
    size_t kl, vl;
    const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
    const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
    return run_decode(k, kl, v, vl, ledger, r) ? 1 : run_malformed(e, ledger, k, kl);
}

/* the last run of `ledger` starting at or before `entry`: 1 (in *r; the iterator is left on it), none
 * (0), error (-1) */
static int run_before(Engine *e, rocksdb_iterator_t *it, uint64_t ledger, int64_t entry, Run *r)
{
    unsigned char k[KV_EKEY];
    ekey(k, ledger, entry);
    rocksdb_iter_seek_for_prev(it, (const char *)k, sizeof k);
    if (!rocksdb_iter_valid(it))
        return 0;
    return run_at(e, it, ledger, r);
}

/* the run covering `entry`: 1 (the iterator is left on it), none (0), error (-1) */
static int run_seek(Engine *e, rocksdb_iterator_t *it, uint64_t ledger, int64_t entry, Run *r)
{
    int f = run_before(e, it, ledger, entry, r);
    return f == 1 ? entry < r->first + (int64_t)r->count : f;
}

static rocksdb_iterator_t *ledger_iter(Engine *e, uint64_t ledger, unsigned char lo[KV_EKEY],
                                       unsigned char hi[KV_EKEY], rocksdb_readoptions_t **ro)
{
    ekey(lo, ledger, 0);
    ekey(hi, ledger + 1, 0); /* (ledger ids are < 2^63: no wrap) */
    *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_lower_bound(*ro, (const char *)lo, KV_EKEY);
    rocksdb_readoptions_set_iterate_upper_bound(*ro, (const char *)hi, KV_EKEY);
    return rocksdb_create_iterator(e->kv->db, *ro);
}

int kv_get_loc(Engine *e, uint64_t ledger, int64_t entry, Loc *out)
{
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    Run r;
    int found = run_seek(e, it, ledger, entry, &r);
    if (found == 1) {
        RunCursor c;
        run_cursor(&r, &c);
        run_loc(&r, (uint32_t)(entry - r.first), &c, out);
    }
    if (kv_iter_end(e, it, ro) < 0)
        return -1;
    return found;
}

/* kv_get_loc of entries[0..n) of `ledger`, in ascending order (repeats allowed): found[i] 1 with
 * out[i], or 0.  One iterator for them all, each run sought and decoded once and walked forward
 * (kv_get_loc creates an iterator and walks a run from its start for every entry: compaction's
 * re-point of hundreds of thousands of small entries spent seconds so); an entry no run covers
 * makes every entry before the next run absent without another seek (a seek in a range a
 * delete just dropped took ~1.4 ms: a ledger deleted and created again mid-pass held a batch
 * 0.6 s).  0, or -1 on a read error (or a malformed record met, the error set: also the record
 * after a gap, even if no entry looked up reaches it).  Runs never overlap: a record inside a
 * run already decoded is not read (only a damaged index has one). */
int kv_get_locs(Engine *e, uint64_t ledger, const int64_t *entries, size_t n, Loc *out, int *found)
{
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    Run r;
    RunCursor c;
    int have = 0, rc = 0; /* have: r covers entries from r.first + c.pos on */
    int64_t gap_lo = 0, gap_hi = 0; /* [gap_lo, gap_hi): no run covers them (have == 0) */
    for (size_t i = 0; i < n; i++) {
        int64_t x = entries[i];
        if (have == 0 && x >= gap_lo && x < gap_hi) {
            found[i] = 0;
            continue;
        }
        if (!(have == 1 && x >= r.first + (int64_t)c.pos && x < r.first + (int64_t)r.count)) {
            have = run_seek(e, it, ledger, x, &r);
            if (have < 0) {
                rc = -1;
                break;
            }
            if (have == 1)
                run_cursor(&r, &c);
            else { /* absent: so is every entry before the next run */
                unsigned char k[KV_EKEY];
                if (rocksdb_iter_valid(it))
                    rocksdb_iter_next(it);
                else {
                    ekey(k, ledger, x);
                    rocksdb_iter_seek(it, (const char *)k, sizeof k);
                }
                Run nr;
                int f = rocksdb_iter_valid(it) ? run_at(e, it, ledger, &nr) : 0;
                if (f < 0) {
                    rc = -1;
                    break;
                }
                gap_lo = x;
                gap_hi = f ? nr.first : INT64_MAX;
            }
        }
        found[i] = have == 1;
        if (have == 1)
            run_loc(&r, (uint32_t)(x - r.first), &c, &out[i]);
    }
    if (kv_iter_end(e, it, ro) < 0)
        rc = -1;
    return rc;
}

int kv_last_entry(Engine *e, uint64_t ledger, int64_t *last)
{
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    Run r;
    int found = run_before(e, it, ledger, INT64_MAX, &r);
    *last = found == 1 ? r.first + (int64_t)r.count - 1 : -1;
    if (kv_iter_end(e, it, ro) < 0 || found < 0)
        return -1;
    return 0;
}

/* Call cb for each stored location of `ledger` with from <= entry <= to, in entry order, until it
 * returns nonzero.  Returns 0, or -1 on a read error. */
int kv_scan_locs(Engine *e, uint64_t ledger, int64_t from, int64_t to, int (*cb)(void *, const Loc *), void *arg)
{
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    Run r;
    int rc = run_seek(e, it, ledger, from, &r);
    if (rc == 0) { /* from is in no run: the first run after it */
        unsigned char k[KV_EKEY];
        ekey(k, ledger, from);
        rocksdb_iter_seek(it, (const char *)k, sizeof k);
    }
    int stop = rc < 0;
    for (; !stop && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        if (run_at(e, it, ledger, &r) < 0) {
            rc = -1;
            break;
        }
        if (r.first > to)
            break;
        RunCursor c;
        run_cursor(&r, &c);
        for (uint32_t i = from > r.first ? (uint32_t)(from - r.first) : 0; i < r.count && r.first + i <= to; i++) {
            Loc lc;
            run_loc(&r, i, &c, &lc);
            if (cb(arg, &lc)) {
                stop = 1;
                break;
            }
        }
    }
    if (kv_iter_end(e, it, ro) < 0 || rc < 0)
        return -1;
    return 0;
}

/* Call cb(arg, first, last) for each run of `ledger`, in entry order (runs never overlap; adjacent
 * ones are not merged), until it returns nonzero.  Returns 0, or -1 on a read error. */
int kv_scan_runs(Engine *e, uint64_t ledger, int (*cb)(void *, int64_t, int64_t), void *arg)
{
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    rocksdb_iter_seek(it, (const char *)lo, sizeof lo);
    int rc = 0;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        Run r;
        if (run_at(e, it, ledger, &r) < 0) {
            rc = -1;
            break;
        }
        if (cb(arg, r.first, r.first + (int64_t)r.count - 1))
            break;
    }
    return kv_iter_end(e, it, ro) < 0 ? -1 : rc;
}

/* append one run record (n locations of one ledger, consecutive entries and records): uniform
 * when every length is the same, else varint lengths */
static void put_run(KvBatch *b, uint64_t ledger, const Loc *v, size_t n)
{
    unsigned char k[KV_EKEY], val[RUN_HDR + VARINT_MAX * RUN_MAX];
    size_t i = 1, vl = RUN_HDR;
    while (i < n && v[i].len == v[0].len)
        i++;
    ekey(k, ledger, v[0].entry);
    put32(val, v[0].where);
    put32(val + 4, (uint32_t)n | (i == n ? RUN_UNIFORM : RUN_VARINT));
    put64(val + 8, v[0].off);
    if (i == n) {
        put32(val + vl, v[0].len);
        vl += 4;
    } else {
        for (i = 0; i < n; i++)
            vl += varint_put(val + vl, v[i].len);
    }
    rocksdb_writebatch_put((rocksdb_writebatch_t *)b, (const char *)k, sizeof k, (const char *)val, vl);
}

/* does v[i] continue the run that v[i - 1] is in? */
static int continues(const Loc *v, size_t i, size_t runlen)
{
    return runlen < RUN_MAX && v[i].entry == v[i - 1].entry + 1 && v[i].where == v[i - 1].where &&
           v[i].off == v[i - 1].off + LR_HDR + v[i - 1].len;
}

static void put_runs(KvBatch *b, uint64_t ledger, const Loc *v, size_t n)
{
    size_t s = 0;
    for (size_t i = 1; i <= n; i++)
        if (i == n || !continues(v, i, i - s)) {
            put_run(b, ledger, v + s, i - s);
            s = i;
        }
}

/* Index the locations v[0..n) of one ledger (ascending entries).  With `replace` (some may already be
 * indexed: a re-add, a compaction's move), the runs on disk that cover any of them are first cut:
 * their other entries are re-written as runs of their own, and debit(arg, log, bytes) is told of
 * every location replaced.  The batch's order (deletes and remnants before the new runs) keeps the
 * runs disjoint.  Reads the index as it is before the batch: the caller is its only writer. */
int kvb_put_locs(Engine *e, KvBatch *b, uint64_t ledger, const Loc *v, size_t n, int replace,
                 int (*debit)(void *, uint32_t, uint32_t), void *arg)
{
    if (!n)
        return 0;
    if (!replace) {
        put_runs(b, ledger, v, n);
        return 0;
    }
    unsigned char lo[KV_EKEY], hi[KV_EKEY];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = ledger_iter(e, ledger, lo, hi, &ro);
    Run r;
    int rc = run_seek(e, it, ledger, v[0].entry, &r);
    if (rc == 0) {
        unsigned char k[KV_EKEY];
        ekey(k, ledger, v[0].entry);
        rocksdb_iter_seek(it, (const char *)k, sizeof k);
    }
    Loc *keep = malloc(RUN_MAX * sizeof *keep);
    size_t vi = 0;
    if (!keep)
        rc = -1;
    for (; rc >= 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        if (run_at(e, it, ledger, &r) < 0) {
            rc = -1;
            break;
        }
        if (r.first > v[n - 1].entry)
            break;
        /* this run meets [v[0], v[n-1]]: cut out the entries v holds (at most RUN_MAX, which
         * run_decode checked: `keep` holds them all) */
        RunCursor c;
        run_cursor(&r, &c);
        size_t nk = 0, cut = 0;
        for (uint32_t i = 0; i < r.count; i++) {
            Loc lc;
            run_loc(&r, i, &c, &lc);
            while (vi < n && v[vi].entry < lc.entry)
                vi++;
            if (vi < n && v[vi].entry == lc.entry) {
                cut++;
                if (debit && debit(arg, lc.where, LR_HDR + lc.len))
                    rc = -1;
            } else {
                keep[nk++] = lc;
            }
        }
        if (cut) {
            rocksdb_writebatch_delete((rocksdb_writebatch_t *)b, (const char *)k, kl);
            put_runs(b, ledger, keep, nk);
        }
    }
    free(keep);
    if (kv_iter_end(e, it, ro) < 0)
        rc = -1;
    if (rc >= 0)
        put_runs(b, ledger, v, n);
    return rc < 0 ? -1 : 0;
}

/* every ledger id in the ledger index, ascending (malloc'ed) */
int kv_ledger_ids(Engine *e, uint64_t **ids, size_t *n)
{
    unsigned char lo[1] = {'L'}, hi[1] = {'M'};
    size_t cap = 1024;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return -1;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kv_iter(e, hi, 1, &ro);
    rocksdb_readoptions_set_fill_cache(ro, 0);
    for (rocksdb_iter_seek(it, (const char *)lo, 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        if (kl != 9)
            continue;
        if (*n == cap) {
            uint64_t *p = realloc(*ids, cap * 2 * sizeof *p);
            if (!p) {
                kv_iter_end(e, it, ro);
                return -1;
            }
            *ids = p;
            cap *= 2;
        }
        (*ids)[(*n)++] = unbe64(k + 1);
    }
    return kv_iter_end(e, it, ro);
}

/* the entry-log table: cb(arg, id, size, idx_size, live) per log, ascending ids */
int kv_logs(Engine *e, int (*cb)(void *, uint32_t, uint64_t, uint64_t, uint64_t), void *arg)
{
    unsigned char lo[1] = {'G'}, hi[1] = {'H'};
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kv_iter(e, hi, 1, &ro);
    int rc = 0;
    for (rocksdb_iter_seek(it, (const char *)lo, 1); rocksdb_iter_valid(it) && !rc; rocksdb_iter_next(it)) {
        size_t kl, vl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
        if (kl != 5 || vl != 24)
            continue;
        uint32_t id = (uint32_t)k[1] << 24 | (uint32_t)k[2] << 16 | (uint32_t)k[3] << 8 | k[4];
        rc = cb(arg, id, get64(v), get64(v + 8), get64(v + 16));
    }
    int r = kv_iter_end(e, it, ro);
    return rc ? rc : r;
}

/* "M" records: 1 found, 0 absent, -1 error */
int kv_get_meta(Engine *e, const char *name, uint64_t *val)
{
    unsigned char k[32], v[8];
    size_t kl = strlen(name), n = 0;
    k[0] = 'M';
    memcpy(k + 1, name, kl);
    int r = kv_get(e, k, kl + 1, v, sizeof v, &n, NULL);
    if (r == 1)
        *val = n == 8 ? get64(v) : n == 4 ? get32(v) : 0;
    return r;
}

/* ---------------------------------------------------------------- write batches */
KvBatch *kvb_new(void) { return (KvBatch *)rocksdb_writebatch_create(); }
void kvb_free(KvBatch *b)
{
    if (b)
        rocksdb_writebatch_destroy((rocksdb_writebatch_t *)b);
}
size_t kvb_count(KvBatch *b) { return (size_t)rocksdb_writebatch_count((rocksdb_writebatch_t *)b); }


/* the ledger's record (caller holds mu, or owns l) */
int kvb_put_ledger(KvBatch *b, const Ledger *l)
{
    size_t n = 15 + l->keylen + (l->has_lac ? l->laclen : 0);
    unsigned char stackbuf[256], *v = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!v)
        return -1;
    put64(v, l->inc);
    v[8] = (unsigned char)((l->has_key ? 1 : 0) | (l->fenced ? 2 : 0) | (l->has_lac ? 4 : 0));
    uint16_t kl = l->keylen;
    memcpy(v + 9, &kl, 2);
    if (kl)
        memcpy(v + 11, l->key, kl);
    uint32_t ll = l->has_lac ? l->laclen : 0;
    put32(v + 11 + kl, ll);
    if (ll)
        memcpy(v + 15 + kl, l->lac, ll);
    unsigned char k[9];
    lkey(k, l->id);
    rocksdb_writebatch_put((rocksdb_writebatch_t *)b, (const char *)k, sizeof k, (const char *)v, n);
    if (v != stackbuf)
        free(v);
    return 0;
}

/* the ledger's record and every location of it */
void kvb_del_ledger(KvBatch *b, uint64_t ledger)
{
    unsigned char k[9], lo[KV_EKEY], hi[KV_EKEY];
    lkey(k, ledger);
    rocksdb_writebatch_delete((rocksdb_writebatch_t *)b, (const char *)k, sizeof k);
    ekey(lo, ledger, 0);
    ekey(hi, ledger + 1, 0);
    rocksdb_writebatch_delete_range((rocksdb_writebatch_t *)b, (const char *)lo, sizeof lo, (const char *)hi,
                                    sizeof hi);
}

void kvb_put_log(KvBatch *b, uint32_t id, uint64_t size, uint64_t idx_size, uint64_t live)
{
    unsigned char k[5], v[24];
    gkey(k, id);
    put64(v, size);
    put64(v + 8, idx_size);
    put64(v + 16, live);
    rocksdb_writebatch_put((rocksdb_writebatch_t *)b, (const char *)k, sizeof k, (const char *)v, sizeof v);
}

void kvb_del_log(KvBatch *b, uint32_t id)
{
    unsigned char k[5];
    gkey(k, id);
    rocksdb_writebatch_delete((rocksdb_writebatch_t *)b, (const char *)k, sizeof k);
}

void kvb_put_meta(KvBatch *b, const char *name, uint64_t val)
{
    unsigned char k[32], v[8];
    size_t kl = strlen(name);
    k[0] = 'M';
    memcpy(k + 1, name, kl);
    put64(v, val);
    rocksdb_writebatch_put((rocksdb_writebatch_t *)b, (const char *)k, kl + 1, (const char *)v, sizeof v);
}

/* Apply a batch atomically.  sync: the WAL (with every batch before this one) is durable on return. */
int kvb_write(Engine *e, KvBatch *b, int sync)
{
    char *err = NULL;
    rocksdb_write(e->kv->db, sync ? e->kv->wo_sync : e->kv->wo, (rocksdb_writebatch_t *)b, &err);
    if (err) {
        kv_write_failed(e, err);
        return kv_fail(e, "write", err), E_IO;
    }
    return E_OK;
}

/* Test hook (eng_index_put_raw): write one raw record, synced -- a crafted (e.g. malformed)
 * record for the tests of the index's checks.  Never called by the engine itself. */
int kv_put_raw(Engine *e, const unsigned char *k, size_t kl, const unsigned char *v, size_t vl)
{
    KvBatch *b = kvb_new();
    if (!b)
        return E_IO;
    rocksdb_writebatch_put((rocksdb_writebatch_t *)b, (const char *)k, kl, (const char *)v, vl);
    int rc = kvb_write(e, b, 1);
    kvb_free(b);
    return rc;
}

int eng_index_put_raw(Engine *e, const unsigned char *k, size_t kl, const unsigned char *v, size_t vl)
{
    return kv_put_raw(e, k, kl, v, vl);
}

/* Make every batch written so far durable (fsync of RocksDB's WAL). */
int kv_sync(Engine *e)
{
    char *err = NULL;
    rocksdb_flush_wal(e->kv->db, 1, &err);
    if (err) {
        kv_write_failed(e, err);
        return kv_fail(e, "sync", err), E_IO;
    }
    return E_OK;
}
