/* bkspark bookie storage engine: journal (group commit), write cache, entry logs + index,
 * ledger state, checkpoint/LastLogMark, compaction.  See README.md for the file formats.
 *
 * Threading: one mutex `mu` guards all in-memory state (ledger map, index, write caches,
 * pending journal buffers, log table).  Group commits write+sync outside `mu`, one at a time per
 * journal (one journal per journal directory, ledger L in journal L % n), on the first waiting
 * adder's thread (or that journal's thread: at close, and for the other journals of a batch that
 * spans several).
 * `ckpt_mu` serialises checkpoints (flushes), close and the short end of a compaction pass;
 * `compact_mu` serialises compaction passes and close, whose copying runs beside flushes (lock
 * order compact_mu -> ckpt_mu -> mu).
 * No function here touches Python objects; the binding layer (module.c) releases the GIL
 * around every call that may block.
 */
#ifndef BKS_ENGINE_H
#define BKS_ENGINE_H
#include <stddef.h>
#include <stdint.h>

#define BKS_EOK 0
#define BKS_EBADREQ 404
#define BKS_EIO 501
#define BKS_EUA 502
#define BKS_EFENCED 504

/* engine error kinds (returned as negative ints by engine calls) */
enum { E_OK = 0, E_NOLEDGER = -1, E_NOENTRY = -2, E_IO = -3, E_BADREQ = -4, E_CLOSED = -5, E_UA = -6 };


#define MAX_BODY (64u << 20)
#define MAX_KEY 1024u

/* the engine (engine_int.h; opaque here: module.c reads it only through the accessors below) */
typedef struct Engine Engine;

enum {
    TM_ADD_CRC,      /* adders: checksums outside the lock */
    TM_ADD_LOCKED,   /* adders: time holding mu to enqueue (excludes waits) */
    TM_ADD_SYNCWAIT, /* adders: waiting for the covering fdatasync */
    TM_CACHE_WAIT,   /* adders: waiting for a free cache half */
    TM_J_GROUPWAIT,  /* group commit: waiting for the group to grow */
    TM_J_CRC,        /* group commit: group checksum */
    TM_J_WRITE,      /* group commit: pwrite */
    TM_J_SYNC,       /* group commit: fdatasync */
    TM_F_COLLECT,    /* flush: collecting live cache entries (holds mu) */
    TM_F_SORT,       /* flush: sorting */
    TM_F_WRITE,      /* flush: building + writing entry-log data */
    TM_F_LOGSYNC,    /* flush: fdatasync of entry logs */
    TM_F_IDX,        /* flush: index block write + fdatasync */
    TM_F_REPOINT,    /* flush: re-pointing the index (holds mu) */
    TM_F_STATE,      /* checkpoint: ledgers.state + lastMark + journal gc */
    TM_F_JWAIT,      /* flush: waiting for the journal to cover the swapped half */
    TM_J_ROLL,       /* group commit: rolling to a new file */
    TM_F_DEFSYNC,    /* checkpoint: fdatasync of the entry logs flushed since the last one */
    TM_C_REPOINT,    /* compaction: re-pointing the index to the copies (holds ckpt_mu: no flush) */
    TM_N
};
extern const char *const eng_tm_names[TM_N];

typedef struct {
    uint64_t ledger;
    int64_t entry;
    const unsigned char *key;
    uint32_t keylen;
    int recovery;
    const unsigned char *body;
    uint32_t len;
    uint32_t jcrc, lcrc, rcrc; /* filled by eng_add_entries: journal record crc field, entry-log
                                * record crc, crc of the whole journal record */
} AddReq;

typedef struct {
    const char **journal_dirs; /* one journal per directory (1..64); ledger L uses journal_dirs[L % njournals] */
    int njournals;
    const char **ledger_dirs;
    int nldirs;
    uint64_t write_cache_bytes, group_wait_us, threshold, jmax_size;
    int max_backups, jsync;
    uint64_t entry_log_max;
    double compaction_threshold;
    uint64_t compaction_max_bytes, ckpt_interval_ms;
    int page_cache; /* see Engine.page_cache */
    uint64_t compaction_rate; /* see Engine.compaction_rate */
    uint64_t index_cache_bytes; /* RocksDB block cache of the index (0: 32 MiB) */
    uint64_t ledger_cache_max;  /* unpinned ledgers kept in memory (index.c "the ledger cache") */
    uint64_t index_memtable_bytes; /* one RocksDB memtable of the index (0: 16 MiB; two at most) */
} EngineConfig;

typedef struct {
    uint64_t logs_examined, logs_compacted, logs_deleted, bytes_copied, bytes_reclaimed, entries_copied,
        corrupt_entries;
    uint64_t deleted_skipped; /* ledgers of the chosen logs' blocks not looked up: deleted (led_gone) */
} CompactStats;

int eng_open(const EngineConfig *cfg, Engine **out, char *err, size_t errlen);
void eng_close(Engine *e, int do_checkpoint);
void eng_free(Engine *e);
int eng_add_entries(Engine *e, AddReq *reqs, size_t n, int *status);
int eng_fence(Engine *e, uint64_t ledger, const unsigned char *key, uint32_t keylen);
int eng_set_lac(Engine *e, uint64_t ledger, const unsigned char *lac, uint32_t len);
int eng_delete(Engine *e, uint64_t ledger);
int eng_force(Engine *e);
int eng_checkpoint(Engine *e);
int eng_compact(Engine *e, CompactStats *cs);
/* read: on success *out is malloc'ed (caller frees) */
int eng_read(Engine *e, uint64_t ledger, int64_t entry, unsigned char **out, uint32_t *len, int64_t *eid);
typedef struct {
    int64_t entry;
    unsigned char *data;
    uint32_t len;
} RangeItem;
/* Entries first, first+step, ... <= last (stopping at the first absent one) up to max_bytes (at least one entry);
 * first == -1: the ledger's last entry.  With buf, the
 * bodies are read into buf (bufcap bytes, stopping before an entry that does not fit: no items if the first does not)
 * and items[k].data points into it; without, each items[k].data is malloc'ed (the caller frees it). */
int eng_read_range(Engine *e, uint64_t ledger, int64_t first, int64_t last, int64_t step, uint64_t max_bytes,
                   unsigned char *buf, size_t bufcap, RangeItem **items, size_t *nitems);
void eng_set_crash_point(Engine *e, const char *name); /* test hook (checkpoint.c crash_point) */
/* test hooks (engine.c pause_point): the next thread reaching the named step blocks there until
 * eng_pause_release; eng_pause_wait waits (at most timeout_ms) until one does, 1 if it did */
void eng_set_pause_point(Engine *e, const char *name);
int eng_pause_wait(Engine *e, uint64_t timeout_ms);
void eng_pause_release(Engine *e);
void eng_set_journal_group_max(Engine *e, uint64_t bytes); /* test hook: the group bound (0: JG_MAX) */
/* test hook: allocation n of each later compaction pass fails (0: none); returns how many the last pass made */
uint32_t eng_set_alloc_fail(Engine *e, uint32_t n);
int eng_index_put_raw(Engine *e, const unsigned char *k, size_t kl, const unsigned char *v, size_t vl); /* test hook */
void eng_errclear(void);
const char *eng_errmsg(void); /* message of this thread's last engine error */
void eng_lock(Engine *e);
void eng_unlock(Engine *e);

/* Accessors for the binding: the caller holds mu (eng_lock) across the call and any use of what it
 * returns -- except eng_ledger_ranges and eng_ledger_ids, which scan the index and take mu themselves. */
typedef struct {
    int fenced;
    int64_t last; /* last entry, -1: none */
    int has_key, has_lac;
    const unsigned char *key, *lac; /* valid while mu is held */
    uint32_t keylen, laclen;
} LedgerInfo;
int eng_ledger_info(Engine *e, uint64_t ledger, LedgerInfo *li); /* E_NOLEDGER if absent */
/* the ledger's entries as inclusive ranges [first, last] (malloc'ed, 2 per range); E_NOLEDGER if
 * absent; takes mu itself (do not hold it) */
int eng_ledger_ranges(Engine *e, uint64_t ledger, int64_t **rg, size_t *nr);
/* the ids of all ledgers, ascending (malloc'ed, NULL on error); takes mu itself (do not hold it) */
uint64_t *eng_ledger_ids(Engine *e, size_t *n);
void eng_last_log_mark(Engine *e, uint64_t *id, uint64_t *pos);
typedef struct {
    uint64_t adds, add_bytes, syncs, sync_ns, jbytes, checkpoints, flushes, paced_flushes, hurried_flushes,
        compactions, compacted_logs, compacted_bytes, compact_copying, replay_records, replay_truncated,
        bg_errors, fences, cache_waits, jz_bytes, jz_behind, jn_rolls;
    uint64_t dio_reads, dio_bytes, ra_hits; /* direct reads of entry logs, their bytes; reads served
                                           * from a read-ahead */
    uint64_t cache_bytes;          /* used bytes of both write-cache halves */
    uint64_t pending_len;          /* journal bytes queued for the next group */
    uint64_t j_waiters, nledgers, nlogs; /* nledgers: ledgers in memory (the ledger cache) */
    uint64_t index_cache_used, converted; /* RocksDB block cache bytes; entries converted at open */
    uint64_t log_live, log_total;  /* entry logs: bytes referenced by the index / written */
    uint64_t jcur_id, jpos;        /* journal 0's current file and position */
    uint64_t njournals;
    int j_failed;                  /* any journal's */
    uint64_t tm[TM_N];             /* timers, ns */
} EngineStats;
void eng_stats(Engine *e, EngineStats *st);
/* The directories' sticky write errors (README "Disk errors"): how many journal (kind 0) or ledger
 * (kind 1) directories there are; directory k's path and the errno of its first failed write (0:
 * none; a ledger index write that failed counts for ledger directory 0, which holds the index). */
int eng_ndirs(Engine *e, int kind);
int eng_dir_error(Engine *e, int kind, int k, const char **path);

#endif
