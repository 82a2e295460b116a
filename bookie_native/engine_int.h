/* bkspark bookie storage engine, internal: the on-disk format constants, the structures the engine files
 * share and the functions one engine file calls in another.  engine.h is the public API (module.c uses only
 * that); README.md lists which file holds what. */
#ifndef BKS_ENGINE_INT_H
#define BKS_ENGINE_INT_H
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>

#include "crc32c.h"
#include "engine.h"
#include "iofault.h" /* (last: engine files' system calls on their own files go through its wrappers) */

/* ---------------------------------------------------------------- formats */
/* Every file and directory the engine creates is private to the bookie's user (0600 / 0700,
 * less the umask): entries, journals and the index are readable by nobody else on the host
 * (issue 48: data files are created private). */
#define DATA_FILE_MODE 0600
#define DATA_DIR_MODE 0700

#define J_MAGIC "BKSJ"
#define J_VERSION 1u
#define J_HDR 512u
#define JR_HDR 12u /* u32 len, u32 type, u32 crc */
#define JG_HDR 24u /* group: "BKSG", u32 len, u32 crc(records), u64 own file offset, u32 crc(file id, bytes 0..20) */
#define JF_SYNC 1u /* journal header flag: written with fdatasync per group */
#define J_SECTOR 512u /* the unit a torn write leaves unwritten (file-offset aligned) */
#define JG_MAX (1u << 30) /* a group's records never exceed this (its length is a u32; journal.c j_room) */
enum { JR_ADD = 1, JR_MKEY = 2, JR_FENCE = 3, JR_LAC = 4, JR_DELETE = 5 };

#define L_MAGIC "BKSL"
#define L_VERSION 1u
#define L_HDR 64u
#define REAP_QUEUE 64 /* files waiting for the reaper thread (more: removed at once) */
#define REAP_SUFFIX ".del" /* a journal handed to the reaper is renamed so (open removes such files) */
#define DIO_ALIGN 4096u /* O_DIRECT offset, length and buffer alignment (>= any logical block size) */
#define LR_HDR 24u /* u32 len(=16+body), u32 crc, u64 ledger, i64 entry */

#define I_MAGIC "BKSI"
#define I_HDR 64u
#define IR_SIZE 40u /* u64 ledger, i64 entry, u64 inc, u64 off, u32 len, u32 zero */

#define S_MAGIC "BKSS"
#define S_VERSION 1u
#define M_MAGIC "BKSM"

#define JPREALLOC (16u << 20)
#define JZ_CHUNK (1u << 20)  /* journal zeroing: one O_DIRECT write + fdatasync (at most) */
#define JZ_AHEAD (32u << 20) /* ... keeps this much written ahead of the journal's end */
#define JZ_GAP (4u << 20)    /* ... starting no nearer the end than this (a group never waits) */
#define JZ_BULK (256u << 10) /* ... not while groups average this much: one block-map update per
                              * such group costs less than writing its bytes twice */

#define WHERE_CACHE0 0xFFFFFFF0u
#define IS_CACHE(w) ((w) >= WHERE_CACHE0)
#define WHERE_DROPPED 0u /* (no entry log has id 0) a location a flush's batch covers, removed by loc_compact */

typedef struct {
    int64_t entry;
    uint32_t where; /* entry-log id (>= 1) or WHERE_CACHE0 + slot */
    uint32_t len;   /* body length */
    uint64_t off;   /* record offset in the entry log / byte offset in the cache arena */
} Loc;

/* A ledger's in-memory state.  The ledger index on disk (kv.c) holds every ledger; memory holds
 * only the ones in use (index.c "the ledger cache"): those with entries in the write cache or
 * changes the index has not received yet (pinned), and a bounded LRU of recently used ones. */
typedef struct Ledger {
    uint64_t id;
    uint64_t inc; /* incarnation: distinguishes a re-created ledger from a deleted one */
    int has_key, fenced, has_lac;
    int dirty;    /* its record changed since the last index batch (on the dirty list) */
    int deleted;  /* tombstone: deleted; kept until an index batch has removed it */
    int purge;    /* the index may hold data of a deleted incarnation: removed by the next batch;
                   * until then reads do not consult the index for this ledger */
    uint32_t purge_seq; /* bumped by every delete (a batch clears purge only if none came since) */
    int inflight; /* its record is in an index batch being written (pinned until it is) */
    int64_t flushed_last; /* highest entry the index holds for this incarnation (-1: none) */
    uint16_t keylen;
    unsigned char *key;
    unsigned char *lac;
    uint32_t laclen;
    Loc *locs; /* entries in the write cache, sorted by entry */
    size_t n, cap;
    struct Ledger *next; /* hash chain */
    struct Ledger *lru_prev, *lru_next; /* most recently used first */
} Ledger;

#define KV_EKEY 17u
#define IDX_MEMTABLE (16u << 20) /* default RocksDB memtable size (two of them at most) */
#define IDX_FORMAT 2u            /* "M format": 2 = the RocksDB index (1 was ledgers.state + .idx) */
typedef struct Kv Kv;
typedef struct KvBatch KvBatch;

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
    int gdirty;   /* size or live bytes changed since its index record was last written */
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

/* One journal: a directory of journal files with its own group commit, journal thread, zeroing
 * thread and LastLogMark.  Every field is guarded by the engine's mu (like the rest of the
 * in-memory state); a commit's I/O runs outside it.  Journal k's mark is the file lastMark
 * (k == 0) or lastMark.<k> in every ledger dir. */
typedef struct Journal {
    Engine *e;
    int k;     /* its index in e->jn */
    char *dir; /* its directory */
    int lock_fd; /* flock on dir/LOCK */
    Buf pending, writing;
    uint32_t pending_gcrc; /* crc32c of the records in `pending` (the group checksum, built up) */
    uint64_t j_enq, j_written, j_synced; /* logical byte sequence numbers */
    uint64_t del_seq; /* j_enq just after the last DELETE_LEDGER record: a lookup that finds no
                       * ledger waits until it is synced (index.c led_lookup_durable) */
    uint64_t pending_since_ns;
    int j_failed, j_stop, j_waiters;
    int j_busy;     /* a group commit is running (on the journal thread or a waiter's) */
    int j_grouping; /* ... and is in its group wait */
    int j_entering; /* add_entries calls that will enqueue to this journal soon (adaptive group commit) */
    pthread_cond_t jcv, synced_cv;
    pthread_cond_t gcv; /* a committer's group wait: an entrant finished enqueueing */
    int jfd;
    uint64_t jcur_id, jpos, jprealloc, jdropped; /* jdropped: journal bytes below it are out of the page cache */
    JFile *jfiles;
    size_t njfiles, jfcap;
    pthread_t jthread;
    int jthread_started;
    /* journal zeroing (journal.c "journal zeroing"); offsets in the current journal file */
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
    /* checkpoint */
    uint64_t flush_mark_seq; /* seq covering everything of this journal in the flushing cache half */
    uint64_t mark_id, mark_pos; /* this journal's LastLogMark */
    int have_mark;              /* a valid mark was found at open (or written since) */
    uint64_t jgc_mark; /* the mark's journal id gc_journals last deleted up to (mu) */
} Journal;

#define MAX_JOURNALS 64

struct Engine {
    /* config */
    char **ledger_dirs;
    int nldirs;
    size_t cache_half;
    uint64_t group_wait_ns, threshold, jmax_size, entry_log_max;
    int max_backups, jsync;
    double compaction_threshold;
    uint64_t compaction_max_bytes, ckpt_interval_ns;
    uint64_t compaction_rate; /* bytes/s a compaction pass copies at most (0: unlimited) */
    int page_cache; /* keep entry-log pages in the OS page cache (else: dropped after writeback,
                     * reads are direct; see entrylog.c "entry logs and the page cache") */

    pthread_mutex_t mu, ckpt_mu, compact_mu;
    pthread_cond_t cache_cv, ckpt_cv;
    pthread_cond_t compact_cv; /* a compaction pass waiting out its rate (close wakes it) */

    /* ledgers: the in-memory ledger cache (index.c) over the on-disk index (kv.c) */
    Kv *kv;
    uint64_t index_cache_bytes; /* RocksDB block cache */
    uint64_t index_memtable_bytes; /* one RocksDB memtable (two at most; the WAL is held to 4 of them) */
    size_t ledger_cache_max;    /* ledgers kept in memory beyond the pinned ones */
    Ledger **buckets;
    size_t nbuckets, nledgers;
    Ledger *lru_head, *lru_tail;
    uint64_t *dirty;            /* ids of ledgers with dirty set (for the next index batch) */
    size_t ndirty, dirtycap;
    uint64_t next_inc;
    uint64_t index_gen;         /* bumped by every index batch (a lookup outside mu re-checks it) */
    int index_failed;           /* an index write or sync failed (its errno): no flush or mark moves
                                 * again (restart) */
    int replay_failed;          /* a replayed record could not be applied (open fails) */
    uint64_t st_converted;      /* entries converted from a format-1 directory at open */
    char crash_at[64];          /* test hook: BKSPARK_STORAGE_CRASH_AT (see crash_point) */
    /* test hook (engine.c pause_point): the next thread reaching step pause_at blocks there */
    char pause_at[64];
    int pause_armed, paused;    /* (pause_armed is read without mu first: atomic) */
    pthread_cond_t pause_cv;
    uint64_t jg_max;            /* a journal group's records never exceed this: JG_MAX (a test hook lowers it) */
    /* test hook (compaction.c c_alloc_fails): allocation number alloc_fail_at of a compaction pass
     * returns NULL (0: none); alloc_count counts the pass's allocations (compact_mu) */
    uint32_t alloc_fail_at, alloc_count;

    /* write cache */
    Cache cache[2];
    int active;
    int flush_pending;       /* cache[!active] holds data awaiting flush */
    uint64_t swap_ns, fill_ns; /* last swap; how long the half now flushing took to fill */

    /* journals (one per journal directory; ledger L's records go to jn[L % njournals]) */
    Journal **jn;
    int njournals;

    /* entry logs */
    LogFile **logs; /* sorted by id */
    size_t nlogs, logcap;
    LogFile *wlog; /* current write log */
    uint32_t next_log_id;
    int next_log_dir;

    /* checkpoint thread */
    pthread_t cthread;
    int cthread_started, c_stop;
    /* reaper thread (reap_later): files to remove a step at a time, off the thread that found them
     * (mu guards the queue) */
    pthread_t rthread;
    int rthread_started, r_stop;
    pthread_cond_t r_cv;
    char *reap_q[REAP_QUEUE];
    size_t reap_n;
    int reap_rescan; /* renamed journals the queue had no room for wait on disk */
    int ckpt_waiting; /* checkpoint/close calls waiting for ckpt_mu (a paced flush hurries) */
    uint64_t last_full_ns;   /* time of the last state+lastMark write */
    uint64_t st_flushes, st_paced_flushes, st_hurried_flushes; /* paced: see entrylog.c "paced flushes" */
    int flush_failed; /* last flush failed: adds waiting for cache space get EIO */
    /* per ledger dir: the errno of its first failed write, writeback, sync, rename or creation --
     * sticky until restart (README "Disk errors").  A page whose writeback failed is marked clean
     * and the error is reported once per descriptor, so no later fdatasync can prove that file
     * durable: while any is set no flush, compaction or LastLogMark moves (the journal keeps
     * covering everything since the last mark; a restart replays it into fresh entry logs) (mu) */
    int *ldir_err;
    void *fw, *fw_tmp; /* flush scratch (WItem arrays), reused across flushes (ckpt_mu) */
    size_t fw_cap;
    /* a flush is writing entry logs and has not re-pointed the index yet: logs with id >=
     * flush_from_log (the write log it started in, and any it rolls to) hold records the index
     * does not count yet, so compaction must not take them (mu) */
    int flushing;
    uint32_t flush_from_log;
    int closing; /* close has begun: a compaction pass stops at its next chunk (mu) */

    int closed;
    int lock_fd; /* flock on ledger_dirs[0]/LOCK (each journal holds its dir's) */
    char errmsg[512];

    /* stats */
    uint64_t st_adds, st_add_bytes, st_syncs, st_sync_ns, st_jbytes, st_checkpoints, st_compactions,
        st_compacted_logs, st_compacted_bytes, st_deleted_logs, st_replay_records, st_replay_truncated,
        st_bg_errors, st_fences, st_cache_waits, st_jz_bytes, st_jz_behind, st_jn_rolls,
        st_compact_copying; /* bytes the running compaction pass has copied so far (0: none running) */
    uint64_t st_dio_reads, st_dio_bytes, st_ra_hits; /* direct reads, their bytes; reads served from a
                                                      * thread's read-ahead (atomics) */
    uint64_t serial; /* this engine's number in the process (read.c: whose bytes a read-ahead holds) */
    /* timers (ns, cumulative; see TM_* and tm_names) -- where the time goes, for the benchmark */
    uint64_t tm[24];

};

/* ---------------------------------------------------------------- small helpers (engine.c) */
static inline uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#define TM_ADD(e, k, v) __atomic_fetch_add(&(e)->tm[k], (v), __ATOMIC_RELAXED)

static inline void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The active half is filled to the flush threshold (half of it): the checkpoint thread flushes
 * the other half now, and a paced flush stops pacing (mu held). */
static inline int at_flush_threshold(const Engine *e)
{
    return e->cache[e->active].used >= e->cache_half / 2;
}

/* ---------------------------------------------------------------- types shared between files */
/* a record a flush or compaction pass writes to an entry log (entrylog.c write_items) */
typedef struct {
    uint64_t ledger, inc, off;
    int64_t entry;
    uint32_t len, crc;
    const unsigned char *src; /* body source (cache arena or read buffer) */
    uint32_t where;           /* destination log id after write */
    uint64_t dst_off;
    uint64_t cache_off;
    int state; /* index batches: 1 re-point it, 2 ... and it may replace an indexed copy, 0 skip */
} WItem;

/* a paced flush's progress (entrylog.c "paced flushes") */
typedef struct {
    uint64_t t0, budget_ns, total, done;
} Pace;


/* ---------------------------------------------------------------- engine.c */
void seterr(Engine *e, const char *fmt, ...);
int buf_reserve(Buf *b, size_t extra);
int write_full(int fd, const void *buf, size_t len, uint64_t off);
int read_full(int fd, void *buf, size_t len, uint64_t off);
int fsync_dir(const char *dir);
void unlink_gradually(Engine *e, const char *path, const char *pause);
void reap_later(Engine *e, const char *path);
void each_reaped_journal(Engine *e, int (*cb)(Engine *, const char *));
int unlink_reaped(Engine *e, const char *path);
int write_atomic(const char *dir, const char *name, const void *data, size_t len);
void swap_for_flush(Engine *e);
void pause_point(Engine *e, const char *name); /* test hook; mu held (released while paused) */
static inline int pause_armed(Engine *e) { return __atomic_load_n(&e->pause_armed, __ATOMIC_ACQUIRE); }

/* ---------------------------------------------------------------- index.c (caller holds mu) */
Ledger *led_mem(Engine *e, uint64_t id); /* in memory (tombstones included), or NULL */
int led_lookup(Engine *e, uint64_t id, Ledger **out); /* memory, else the index; *out NULL: no such ledger */
int led_lookup_durable(Engine *e, uint64_t id, Ledger **out); /* ... NULL only once its delete is durable (may release mu) */
int led_gone(Engine *e, uint64_t id); /* 1: deleted, its locations gone or going; 0: not; -1: index error (takes mu) */
Ledger *led_create(Engine *e, uint64_t id, uint64_t inc); /* after led_lookup found none; inc 0: a new one */
void led_delete(Engine *e, Ledger *l);
void led_dirty(Engine *e, Ledger *l);
int led_set_key(Ledger *l, const unsigned char *key, uint32_t keylen);
void led_free(Engine *e, Ledger *l); /* unlink and free */
void led_evict(Engine *e, size_t steps);
void led_free_all(Engine *e);
LogFile *log_find(Engine *e, uint32_t id);
void log_release(LogFile *lf);
size_t loc_lower(Ledger *l, int64_t id);
Loc *loc_get(Ledger *l, int64_t id);
Loc *loc_get_hint(Ledger *l, int64_t id, size_t *hint);
int loc_set(Ledger *l, int64_t entry, uint32_t where, uint32_t len, uint64_t off); /* a write-cache location */
void loc_compact(Ledger *l); /* drop the locations marked WHERE_DROPPED */

/* ---------------------------------------------------------------- kv.c (no lock needed) */
int kv_open(Engine *e, const char *path, int create, Kv **out);
void kv_close(Kv *kv);
int kv_destroy(Engine *e, const char *path);
uint64_t kv_memory(Kv *kv);
int kv_get_loc(Engine *e, uint64_t ledger, int64_t entry, Loc *out); /* 1 found, 0 absent, -1 error */
int kv_get_locs(Engine *e, uint64_t ledger, const int64_t *entries, size_t n, Loc *out, int *found);
int kv_get_ledger(Engine *e, uint64_t ledger, Ledger *l);          /* fills inc, flags, key, lac */
int kv_has_ledger(Engine *e, uint64_t ledger);                      /* its record is there: 1, 0, -1 */
int kv_last_entry(Engine *e, uint64_t ledger, int64_t *last);
int kv_scan_locs(Engine *e, uint64_t ledger, int64_t from, int64_t to, int (*cb)(void *, const Loc *), void *arg);
int kv_scan_runs(Engine *e, uint64_t ledger, int (*cb)(void *, int64_t, int64_t), void *arg);
int kv_ledger_ids(Engine *e, uint64_t **ids, size_t *n);
int kv_logs(Engine *e, int (*cb)(void *, uint32_t, uint64_t, uint64_t, uint64_t), void *arg);
int kv_get_meta(Engine *e, const char *name, uint64_t *val);
KvBatch *kvb_new(void);
void kvb_free(KvBatch *b);
size_t kvb_count(KvBatch *b);
int kvb_put_locs(Engine *e, KvBatch *b, uint64_t ledger, const Loc *v, size_t n, int replace,
                 int (*debit)(void *, uint32_t, uint32_t), void *arg);
int kvb_put_ledger(KvBatch *b, const Ledger *l);
void kvb_del_ledger(KvBatch *b, uint64_t ledger);
void kvb_put_log(KvBatch *b, uint32_t id, uint64_t size, uint64_t idx_size, uint64_t live);
void kvb_del_log(KvBatch *b, uint32_t id);
void kvb_put_meta(KvBatch *b, const char *name, uint64_t val);
int kvb_write(Engine *e, KvBatch *b, int sync);
int kv_sync(Engine *e);
int kv_put_raw(Engine *e, const unsigned char *k, size_t kl, const unsigned char *v, size_t vl); /* test hook */

/* ---------------------------------------------------------------- wcache.c */
int cache_put(Cache *c, uint64_t ledger, uint64_t inc, int64_t entry, const unsigned char *body, uint32_t len, uint32_t lcrc, int grow, uint64_t *off);
void cache_reset(Cache *c, size_t nominal);
uint32_t log_crc(uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len);

/* ---------------------------------------------------------------- journal.c */
void jpath(Journal *j, uint64_t id, char *out, size_t n);
static inline Journal *led_journal(const Engine *e, uint64_t ledger) { return e->jn[ledger % (uint64_t)e->njournals]; }
int j_any_failed(const Engine *e); /* the errno of a failed journal, 0: none */
void jrec_crcs(uint32_t type, uint32_t plen, uint32_t pcrc, uint32_t *field, uint32_t *rec);
int j_enqueue(Journal *j, uint32_t type, const unsigned char *hdr, size_t hlen, const unsigned char *body, size_t blen, int have_crc, uint32_t field, uint32_t rec);
int j_enq_add(Journal *j, uint64_t ledger, int64_t entry, const unsigned char *body, uint32_t len, uint32_t field, uint32_t rec);
int j_enq_keyrec(Journal *j, uint32_t type, Ledger *l);
/* the pending group holds records and cannot take `need` more bytes of them (mu held; j_room) */
static inline int j_group_full(const Journal *j, size_t need)
{
    return j->pending.len > JG_HDR && j->pending.len - JG_HDR + need > j->e->jg_max;
}
int j_room(Journal *j, size_t need); /* wait until the pending group can take `need` more bytes (may release mu) */
int j_open_file(Journal *j, uint64_t id);
int cond_init_monotonic(pthread_cond_t *cv); /* every cond of the engine: its timed waits ignore wall-clock steps */
void cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t d);
void *journal_thread(void *arg);
void *jzero_thread(void *arg);
int j_wait(Journal *j, uint64_t seq);
void seq_to_mark(Journal *j, uint64_t seq, uint64_t *id, uint64_t *pos);

/* ---------------------------------------------------------------- read.c */
int log_read(Engine *e, LogFile *lf, uint64_t ledger, const Loc *loc, unsigned char *out);
void log_open_direct(Engine *e, LogFile *lf, const char *path);
void log_unref(Engine *e, LogFile *lf);

/* ---------------------------------------------------------------- entrylog.c */
void lpath(Engine *e, int dir, uint32_t id, const char *ext, char *out, size_t n);
int logs_insert(Engine *e, LogFile *lf);
void logs_remove(Engine *e, LogFile *lf);
int check_header(const unsigned char *h, size_t hl, const char *magic, uint32_t id);
void sort_items(WItem *w, size_t n, WItem *o);
int write_items(Engine *e, WItem *w, size_t n, LogFile **cur, LogFile ***created, size_t *ncreated, int arena, int sync, Pace *pace);
int sync_dirty_logs(Engine *e);
void ldir_fail(Engine *e, int dir, int err); /* a write error on ledger dir `dir` (mu NOT held) */
int ldir_check(Engine *e, const char *what);  /* E_IO naming the failed dir if any has failed (mu held) */

/* ---------------------------------------------------------------- checkpoint.c */
int index_sync(Engine *e);
void crash_point(Engine *e, const char *name);
uint64_t *list_journals(Journal *j, size_t *n);
void mark_name(int k, char *out, size_t n); /* lastMark, lastMark.<k> */
int checkpoint_locked(Engine *e, int full, int paced);
void ckpt_lock_now(Engine *e);
void *ckpt_thread(void *arg);

/* ---------------------------------------------------------------- open.c */
int open_index(Engine *e, int have_mark);
int load_logs(Engine *e);
int replay_journals(Engine *e, Journal *j, uint64_t *maxid);
int read_lastmark(Engine *e);

#endif
