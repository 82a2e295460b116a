/* bkspark bookie storage engine: journal (group commit), write cache, entry logs + index,
 * ledger state, checkpoint/LastLogMark, compaction.  See README.md for the file formats.
 *
 * Threading: one mutex `mu` guards all in-memory state (ledger map, index, write caches,
 * pending journal buffer, log table).  Group commits write+sync outside `mu`, one at a time, on
 * the first waiting adder's thread (or the journal thread at close).
 * `ckpt_mu` serialises checkpoints (flushes), close and the short end of a compaction pass;
 * `compact_mu` serialises compaction passes and close, whose copying runs beside flushes (lock
 * order compact_mu -> ckpt_mu -> mu).
 * No function here touches Python objects; the binding layer (module.c) releases the GIL
 * around every call that may block.
 */
#ifndef BKS_ENGINE_H
#define BKS_ENGINE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define BKS_EOK 0
#define BKS_EBADREQ 404
#define BKS_EIO 501
#define BKS_EUA 502
#define BKS_EFENCED 504

/* engine error kinds (returned as negative ints by engine calls) */
enum { E_OK = 0, E_NOLEDGER = -1, E_NOENTRY = -2, E_IO = -3, E_BADREQ = -4, E_CLOSED = -5, E_UA = -6 };

#define WHERE_CACHE0 0xFFFFFFF0u
#define IS_CACHE(w) ((w) >= WHERE_CACHE0)

#define MAX_BODY (64u << 20)
#define MAX_KEY 1024u

typedef struct {
    int64_t entry;
    uint32_t where; /* entry-log id (>= 1) or WHERE_CACHE0 + slot */
    uint32_t len;   /* body length */
    uint64_t off;   /* record offset in the entry log / byte offset in the cache arena */
} Loc;

typedef struct Ledger {
    uint64_t id;
    uint64_t inc; /* incarnation: distinguishes a re-created ledger from a deleted one */
    int has_key, fenced, has_lac;
    uint16_t keylen;
    unsigned char key[MAX_KEY];
    unsigned char *lac;
    uint32_t laclen;
    Loc *locs; /* sorted by entry */
    size_t n, cap;
    struct Ledger *next; /* hash chain */
} Ledger;

typedef struct {
    uint64_t ledger, inc, off;
    int64_t entry;
    uint32_t len, lcrc; /* lcrc: entry-log record crc, computed before insertion */
} CEnt;

/* write-cache half: an arena of entry-log records (24-byte header + body, the exact bytes a flush
 * writes, so it writes them straight from here) + the list of entries in insertion order */
typedef struct {
    unsigned char *buf;
    size_t used, cap;
    CEnt *ents; /* ents[i].off: offset of the body in buf (its record header is the 24 bytes before) */
    size_t n, ncap;
} Cache;

typedef struct LogFile {
    uint32_t id;
    int dir;     /* index into ledger_dirs */
    int fd, idx_fd;
    int dfd;     /* O_DIRECT read descriptor, -1 if unsupported or the page cache is kept */
    uint64_t size, idx_size; /* bytes written (including header) */
    uint64_t live, total;    /* record bytes referenced by the index / written */
    int refs, dead, writable, selected;
    int unsynced; /* written by a flush that did not fdatasync (see sync_dirty_logs) */
    uint64_t prealloc; /* blocks reserved (fallocate KEEP_SIZE) up to here; trimmed when sealed */
} LogFile;

typedef struct {
    uint64_t id, start_seq;
} JFile;

typedef struct {
    /* buffer used for one group: */
    unsigned char *buf;
    size_t len, cap;
} Buf;

typedef struct Engine {
    /* config */
    char *journal_dir;
    char **ledger_dirs;
    int nldirs;
    size_t cache_half;
    uint64_t group_wait_ns, threshold, jmax_size, entry_log_max;
    int max_backups, jsync;
    double compaction_threshold;
    uint64_t compaction_max_bytes, ckpt_interval_ns;
    uint64_t compaction_rate; /* bytes/s a compaction pass copies at most (0: unlimited) */
    int page_cache; /* keep entry-log pages in the OS page cache (else: dropped after writeback,
                     * reads are direct; see engine.c "entry logs and the page cache") */

    pthread_mutex_t mu, ckpt_mu, compact_mu;
    pthread_cond_t jcv, synced_cv, cache_cv, ckpt_cv;
    pthread_cond_t compact_cv; /* a compaction pass waiting out its rate (close wakes it) */
    pthread_cond_t gcv; /* a committer's group wait: an entrant finished enqueueing */

    /* ledgers */
    Ledger **buckets;
    size_t nbuckets, nledgers;
    uint64_t next_inc;

    /* write cache */
    Cache cache[2];
    int active;
    int flush_pending;       /* cache[!active] holds data awaiting flush */
    uint64_t flush_mark_seq; /* journal seq covering everything in the flushing cache */
    uint64_t swap_ns, fill_ns; /* last swap; how long the half now flushing took to fill */

    /* journal */
    Buf pending, writing;
    uint32_t pending_gcrc; /* crc32c of the records in `pending` (the group checksum, built up) */
    uint64_t j_enq, j_written, j_synced; /* logical byte sequence numbers */
    uint64_t pending_since_ns;
    int j_failed, j_stop, j_waiters;
    int j_busy;     /* a group commit is running (on the journal thread or a waiter's) */
    int j_grouping; /* ... and is in its group wait */
    int j_entering; /* add_entries calls that will enqueue soon (adaptive group commit) */
    int jfd;
    uint64_t jcur_id, jpos, jprealloc, jdropped; /* jdropped: journal bytes below it are out of the page cache */
    JFile *jfiles;
    size_t njfiles, jfcap;
    pthread_t jthread;
    int jthread_started;
    /* journal zeroing (engine.c "journal zeroing"); offsets in the current journal file */
    pthread_t zthread;
    int zthread_started, z_stop;
    pthread_cond_t z_cv;
    uint64_t jz_lo, jz_done;   /* the zeroer's written run [jz_lo, jz_done) */
    uint64_t jw_end;           /* end of the last group write begun (page-rounded) */
    uint64_t jz_file, jz_from, jz_to; /* chunk being zeroed (jz_to == 0: none) */
    uint64_t jz_chunk, jz_gap, jz_ahead; /* JZ_* scaled to the journal file size */
    uint64_t jg_avg;           /* moving average of the group writes' bytes (1/8 weight) */
    /* the next journal file, made ready by the zeroer before the roll: header durable, its
     * directory entry synced, [0, jn_done) written; the roll only swaps descriptors */
    int jn_fd;                 /* -1: none prepared */
    int jn_creating;           /* the zeroer is creating it (the roll waits, never races it) */
    uint64_t jn_id, jn_done;
    uint64_t jn_retry_ns;      /* creating it failed (disk full...): not again before this */

    /* entry logs */
    LogFile **logs; /* sorted by id */
    size_t nlogs, logcap;
    LogFile *wlog; /* current write log */
    uint32_t next_log_id;
    int next_log_dir;

    /* checkpoint thread */
    pthread_t cthread;
    int cthread_started, c_stop;
    int ckpt_waiting; /* checkpoint/close calls waiting for ckpt_mu (a paced flush hurries) */
    uint64_t mark_id, mark_pos;
    uint64_t flushed_seq;    /* journal seq up to which everything is in entry logs + index */
    uint64_t last_full_ns;   /* time of the last state+lastMark write */
    uint64_t st_flushes, st_paced_flushes, st_hurried_flushes; /* paced: see engine.c "paced flushes" */
    int flush_failed; /* last flush failed: adds waiting for cache space get EIO */
    int log_sync_failed; /* an entry-log fdatasync failed: never move the mark again (errno) */
    void *fw, *fw_tmp; /* flush scratch (WItem arrays), reused across flushes (ckpt_mu) */
    size_t fw_cap;
    /* a flush is writing entry logs and has not re-pointed the index yet: logs with id >=
     * flush_from_log (the write log it started in, and any it rolls to) hold records the index
     * does not count yet, so compaction must not take them (mu) */
    int flushing;
    uint32_t flush_from_log;
    int closing; /* close has begun: a compaction pass stops at its next chunk (mu) */
    uint64_t jgc_mark; /* the LastLogMark journal id gc_journals last deleted up to (mu) */

    int closed;
    int lock_fds[2]; /* flock on journal_dir/LOCK and ledger_dirs[0]/LOCK */
    char errmsg[512];

    /* stats */
    uint64_t st_adds, st_add_bytes, st_syncs, st_sync_ns, st_jbytes, st_checkpoints, st_compactions,
        st_compacted_logs, st_compacted_bytes, st_deleted_logs, st_replay_records, st_replay_truncated,
        st_bg_errors, st_fences, st_cache_waits, st_jz_bytes, st_jz_behind, st_jn_rolls,
        st_compact_copying; /* bytes the running compaction pass has copied so far (0: none running) */
    /* timers (ns, cumulative; see TM_* and tm_names) -- where the time goes, for the benchmark */
    uint64_t tm[24];

} Engine;

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
    const char *journal_dir;
    const char **ledger_dirs;
    int nldirs;
    uint64_t write_cache_bytes, group_wait_us, threshold, jmax_size;
    int max_backups, jsync;
    uint64_t entry_log_max;
    double compaction_threshold;
    uint64_t compaction_max_bytes, ckpt_interval_ms;
    int page_cache; /* see Engine.page_cache */
    uint64_t compaction_rate; /* see Engine.compaction_rate */
} EngineConfig;

typedef struct {
    uint64_t logs_examined, logs_compacted, logs_deleted, bytes_copied, bytes_reclaimed, entries_copied,
        corrupt_entries;
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
/* ledger accessors (take mu) */
Ledger *eng_find(Engine *e, uint64_t ledger); /* caller must hold mu */
void eng_errclear(void);
const char *eng_errmsg(void); /* message of this thread's last engine error */
void eng_lock(Engine *e);
void eng_unlock(Engine *e);

#endif
