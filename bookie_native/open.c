/* bkspark bookie storage engine: recovery at open -- the index (converting a format-1 directory), the
 * entry-log table, journal replay. */
#define _GNU_SOURCE
#include "engine_int.h"

#include <ctype.h>

static void index_path(Engine *e, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", e->ledger_dirs[0], name);
}

/* the ledger dir holding <id>.log, or -1 */
static int log_dir(Engine *e, uint32_t id)
{
    for (int d = 0; d < e->nldirs; d++) {
        char p[4200];
        lpath(e, d, id, "log", p, sizeof p);
        if (access(p, F_OK) == 0)
            return d;
    }
    return -1;
}

/* ---------------------------------------------------------------- format 1 -> 2 conversion */
/* Format 1 (before the RocksDB index) kept every ledger's state in ledgers.state and each entry
 * log's locations in its .idx file, both loaded whole at open.  Conversion reads them exactly as
 * format 1 did (the same checks refuse a damaged directory), writes the new index into
 * <ledger_dirs[0]>/index.tmp, syncs it and renames it to index: the rename is the commit point.
 * A kill before it leaves index.tmp, which the next open discards and rebuilds from the untouched
 * format-1 files; after it, ledgers.state is removed (the next open finishes that if a kill came
 * first).  The LastLogMark is unchanged, so the journal replay that follows applies exactly what
 * format 1 would have. */
typedef struct {
    uint64_t id, inc;
} IdInc;

static int idinc_cmp(const void *a, const void *b)
{
    const IdInc *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct {
    uint32_t id;
    uint64_t size, idx_size, live;
} LogRow;

static int logrow_cmp(const void *a, const void *b)
{
    const LogRow *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct {
    LogRow *rows;
    size_t n;
} Rows;

static int credit_row(void *arg, const Loc *lc)
{
    Rows *r = arg;
    LogRow key = {lc->where, 0, 0, 0};
    LogRow *row = bsearch(&key, r->rows, r->n, sizeof *r->rows, logrow_cmp);
    if (row)
        row->live += LR_HDR + lc->len;
    return 0;
}

static int batch_if_full(Engine *e, KvBatch **b)
{
    if (kvb_count(*b) < 100000)
        return E_OK;
    int rc = kvb_write(e, *b, 0);
    kvb_free(*b);
    *b = kvb_new();
    return rc != E_OK ? rc : *b ? E_OK : E_IO;
}

static int convert_v1(Engine *e, const char *state_path, const char *final_path)
{
    char tmp[4200];
    index_path(e, "index.tmp", tmp, sizeof tmp);
    int rc = kv_destroy(e, tmp); /* a conversion a kill interrupted */
    if (rc == E_OK)
        rc = kv_open(e, tmp, 1, &e->kv);
    if (rc != E_OK)
        return rc;
    unsigned char *sb = NULL;
    IdInc *incs = NULL;
    LogRow *rows = NULL;
    KvBatch *b = kvb_new();
    int fd = open(state_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    size_t n = 0;
    if (fd < 0 || fstat(fd, &st) < 0 || !(sb = malloc((n = (size_t)st.st_size) ? n : 1)) ||
        read_full(fd, sb, n, 0) < 0 || !b) {
        seterr(e, "cannot read %s: %s", state_path, strerror(errno));
        rc = E_IO;
        goto out;
    }
    if (n < 32 || memcmp(sb, S_MAGIC, 4) != 0 || get32(sb + 4) != S_VERSION ||
        get32(sb + n - 4) != bks_crc32c(0, sb, n - 4)) {
        seterr(e, "ledger state file %s is corrupt (bad magic/version/checksum); refusing to start "
                  "without fencing state", state_path);
        rc = E_IO;
        goto out;
    }
    uint64_t next_inc = get64(sb + 8);
    uint32_t nl = get32(sb + 16);
    uint64_t nled = get64(sb + 20);
    const unsigned char *q = sb + 28, *end = sb + n - 4;
    rows = calloc(nl ? nl : 1, sizeof *rows);
    incs = malloc((nled ? nled : 1) * sizeof *incs);
    if (!rows || !incs || (size_t)(end - q) < (size_t)nl * 20) {
        rc = E_IO;
        goto malformed;
    }
    for (uint32_t i = 0; i < nl; i++, q += 20) {
        rows[i].id = get32(q);
        rows[i].idx_size = get64(q + 12);
    }
    for (uint64_t i = 0; i < nled; i++) {
        if (end - q < 19)
            goto malformed;
        Ledger l = {0};
        l.id = get64(q);
        l.inc = get64(q + 8);
        unsigned flags = q[16];
        uint16_t kl;
        memcpy(&kl, q + 17, 2);
        if (kl > MAX_KEY || end - q < 19 + kl + 4)
            goto malformed;
        l.has_key = flags & 1;
        l.fenced = (flags & 2) != 0;
        l.keylen = kl;
        l.key = (unsigned char *)q + 19;
        q += 19 + kl;
        uint32_t ll = get32(q);
        q += 4;
        if ((size_t)(end - q) < ll)
            goto malformed;
        l.has_lac = (flags & 4) != 0;
        l.lac = (unsigned char *)q;
        l.laclen = ll;
        q += ll;
        incs[i] = (IdInc){l.id, l.inc};
        if (kvb_put_ledger(b, &l) < 0 || (rc = batch_if_full(e, &b)) != E_OK)
            goto out;
    }
    if (q != end)
        goto malformed;
    qsort(incs, nled, sizeof *incs, idinc_cmp);
    qsort(rows, nl, sizeof *rows, logrow_cmp);
    /* every listed log, in id order (for an entry, the last record wins), up to its committed
     * index size (past it: a checkpoint that never completed, which the journal covers) */
    for (uint32_t i = 0; i < nl && rc == E_OK; i++) {
        char p[4200], ip[4200];
        int d = log_dir(e, rows[i].id);
        if (d < 0) {
            seterr(e, "entry log %08x.log is listed in the ledger state but missing from every ledger dir",
                   rows[i].id);
            rc = E_IO;
            break;
        }
        lpath(e, d, rows[i].id, "log", p, sizeof p);
        lpath(e, d, rows[i].id, "idx", ip, sizeof ip);
        unsigned char h[L_HDR];
        int lfd = open(p, O_RDONLY | O_CLOEXEC);
        int ok = lfd >= 0 && read_full(lfd, h, L_HDR, 0) == 0 && check_header(h, L_HDR, L_MAGIC, rows[i].id) &&
                 fstat(lfd, &st) == 0;
        if (lfd >= 0)
            close(lfd);
        if (!ok) {
            seterr(e, "entry log %s is missing or has a corrupt header", p);
            rc = E_IO;
            break;
        }
        rows[i].size = (uint64_t)st.st_size;
        size_t committed = (size_t)rows[i].idx_size, isz = 0;
        unsigned char *ib = NULL;
        int ifd = open(ip, O_RDONLY | O_CLOEXEC);
        if (ifd >= 0 && fstat(ifd, &st) == 0 && (ib = malloc((isz = (size_t)st.st_size) ? isz : 1)) &&
            read_full(ifd, ib, isz, 0) < 0)
            isz = 0;
        if (ifd >= 0)
            close(ifd);
        if (isz < I_HDR || !check_header(ib, I_HDR, I_MAGIC, rows[i].id) || isz < committed) {
            seterr(e, "entry log index %s is missing, truncated (%zu < %zu bytes) or has a corrupt header", ip, isz,
                   committed);
            free(ib);
            rc = E_IO;
            break;
        }
        rows[i].idx_size = isz;
        for (size_t off = I_HDR; off < committed && rc == E_OK;) {
            uint32_t cnt = off + 8 <= isz ? get32(ib + off) : 0;
            size_t bl = (size_t)cnt * IR_SIZE;
            if (cnt == 0 || off + 8 + bl > isz ||
                get32(ib + off + 4) != bks_crc32c(bks_crc32c(0, ib + off, 4), ib + off + 8, bl)) {
                seterr(e, "entry log index %s corrupt at offset %zu (inside the checkpointed part)", ip, off);
                rc = E_IO;
                break;
            }
            for (uint32_t k = 0; k < cnt && rc == E_OK; k++) {
                const unsigned char *r = ib + off + 8 + (size_t)k * IR_SIZE;
                IdInc key = {get64(r), 0}, *li = bsearch(&key, incs, nled, sizeof *incs, idinc_cmp);
                if (!li || li->inc != get64(r + 16))
                    continue; /* a deleted incarnation */
                Loc lc = {(int64_t)get64(r + 8), rows[i].id, get32(r + 32), get64(r + 24)};
                kvb_put_locs(e, b, key.id, &lc, 1, 0, NULL, NULL); /* (one-entry runs: a later record for
                                                                   * the same entry replaces it whole) */
                e->st_converted++;
                rc = batch_if_full(e, &b);
            }
            off += 8 + bl;
        }
        free(ib);
    }
    if (rc == E_OK)
        rc = kvb_write(e, b, 0);
    /* live bytes per log: what the converted index points at */
    Rows rw = {rows, nl};
    for (uint64_t i = 0; i < nled && rc == E_OK; i++)
        if (kv_scan_locs(e, incs[i].id, 0, INT64_MAX, credit_row, &rw) < 0)
            rc = E_IO;
    if (rc == E_OK) {
        kvb_free(b);
        b = kvb_new();
        for (uint32_t i = 0; b && i < nl; i++)
            kvb_put_log(b, rows[i].id, rows[i].size, rows[i].idx_size, rows[i].live);
        if (b) {
            kvb_put_meta(b, "next_inc", next_inc ? next_inc : 1);
            kvb_put_meta(b, "format", IDX_FORMAT);
        }
        rc = b ? kvb_write(e, b, 1) : E_IO;
    }
    kv_close(e->kv);
    e->kv = NULL;
    if (rc == E_OK)
        crash_point(e, "convert-before-rename");
    if (rc == E_OK && (rename(tmp, final_path) < 0 || fsync_dir(e->ledger_dirs[0]) < 0)) {
        seterr(e, "cannot rename the converted index %s to %s: %s", tmp, final_path, strerror(errno));
        rc = E_IO;
    }
    if (rc == E_OK)
        crash_point(e, "convert-after-rename");
    goto out;
malformed:
    seterr(e, "ledger state file %s is malformed", state_path);
    rc = E_IO;
out:
    if (fd >= 0)
        close(fd);
    if (e->kv) {
        kv_close(e->kv);
        e->kv = NULL;
    }
    kvb_free(b);
    free(sb);
    free(incs);
    free(rows);
    return rc;
}

/* Open the index (README "The index"), converting a format-1 directory first. */
int open_index(Engine *e, int have_mark)
{
    char path[4200], state[4200], current[4300];
    index_path(e, "index", path, sizeof path);
    index_path(e, "ledgers.state", state, sizeof state);
    snprintf(current, sizeof current, "%s/CURRENT", path);
    int have_state = access(state, F_OK) == 0, have_index = access(current, F_OK) == 0;
    int rc = E_OK;
    if (have_state && !have_index)
        rc = convert_v1(e, state, path);
    else if (have_mark && !have_index) {
        seterr(e, "lastMark present but the ledger index %s is missing: refusing to start without the fences and "
                  "entry locations it holds (restore it, or decommission this bookie so that its ledgers are "
                  "re-replicated)", path);
        rc = E_IO;
    }
    if (rc == E_OK)
        rc = kv_open(e, path, 1, &e->kv);
    if (rc != E_OK)
        return rc;
    uint64_t fmt = 0, next_inc = 1;
    int r = kv_get_meta(e, "format", &fmt);
    if (r == 1 && fmt != IDX_FORMAT) {
        seterr(e, "ledger index %s has format %llu; this bookie reads format %u: refusing to start", path,
               (unsigned long long)fmt, IDX_FORMAT);
        return E_IO;
    }
    if (r == 0) { /* a new index */
        KvBatch *b = kvb_new();
        if (!b)
            return E_IO;
        kvb_put_meta(b, "format", IDX_FORMAT);
        rc = kvb_write(e, b, 1);
        kvb_free(b);
        if (rc != E_OK)
            return rc;
    }
    if (r < 0 || kv_get_meta(e, "next_inc", &next_inc) < 0)
        return E_IO;
    e->next_inc = next_inc ? next_inc : 1;
    if (have_state && (unlink(state) < 0 || fsync_dir(e->ledger_dirs[0]) < 0)) { /* converted */
        seterr(e, "cannot remove %s after converting it: %s", state, strerror(errno));
        return E_IO;
    }
    return E_OK;
}

/* ---------------------------------------------------------------- the entry-log table */
typedef struct {
    LogRow *v;
    size_t n, cap;
} RowList;

static int push_row(void *arg, uint32_t id, uint64_t size, uint64_t idx_size, uint64_t live)
{
    RowList *r = arg;
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 64;
        LogRow *p = realloc(r->v, nc * sizeof *p);
        if (!p)
            return -1;
        r->v = p;
        r->cap = nc;
    }
    r->v[r->n++] = (LogRow){id, size, idx_size, live};
    return 0;
}

static int open_log(Engine *e, int dir, const LogRow *row)
{
    char p[4200], q[4200];
    lpath(e, dir, row->id, "log", p, sizeof p);
    lpath(e, dir, row->id, "idx", q, sizeof q);
    LogFile *lf = calloc(1, sizeof *lf);
    if (!lf) {
        seterr(e, "out of memory opening entry log %s", p);
        return E_IO;
    }
    lf->id = row->id;
    lf->dir = dir;
    lf->dfd = -1;
    lf->fd = open(p, O_RDWR | O_CLOEXEC);
    lf->idx_fd = open(q, O_RDWR | O_CLOEXEC);
    unsigned char h[L_HDR];
    struct stat st, ist;
    if (lf->fd < 0 || read_full(lf->fd, h, L_HDR, 0) < 0 || !check_header(h, L_HDR, L_MAGIC, row->id) ||
        fstat(lf->fd, &st) < 0) {
        seterr(e, "entry log %s is missing or has a corrupt header", p);
        log_release(lf);
        return E_IO;
    }
    log_open_direct(e, lf, p);
    lf->size = (uint64_t)st.st_size;
    lf->total = lf->size - L_HDR;
    lf->live = row->live;
    /* (the .idx only lists a log's records for compaction; the index is what reads use) */
    lf->idx_size = lf->idx_fd >= 0 && fstat(lf->idx_fd, &ist) == 0 ? (uint64_t)ist.st_size : 0;
    if (logs_insert(e, lf) < 0) {
        log_release(lf);
        seterr(e, "out of memory opening entry log %s", p);
        return E_IO;
    }
    return E_OK;
}

/* Open every entry log the index lists (one missing from every ledger dir refuses startup: the
 * index points into it) and remove every other log file: one the index does not list holds nothing
 * it points at -- a flush or compaction output whose index batch never became durable (the journal
 * covers what a flush wrote; a compaction's originals are still listed), a log torn at creation,
 * or a compaction victim a kill left before its unlink -- and an .idx without its log. */
int load_logs(Engine *e)
{
    RowList rl = {0};
    if (kv_logs(e, push_row, &rl) != 0) {
        free(rl.v);
        if (!e->errmsg[0])
            seterr(e, "out of memory reading the entry-log table");
        return E_IO;
    }
    int rc = E_OK;
    uint32_t maxid = 0;
    for (size_t i = 0; i < rl.n && rc == E_OK; i++) {
        int d = log_dir(e, rl.v[i].id);
        if (d < 0) {
            seterr(e, "entry log %08x.log is listed in the ledger index but missing from every ledger dir",
                   rl.v[i].id);
            rc = E_IO;
        } else {
            rc = open_log(e, d, &rl.v[i]);
        }
        if (rl.v[i].id > maxid)
            maxid = rl.v[i].id;
    }
    for (int d = 0; d < e->nldirs && rc == E_OK; d++) {
        DIR *dd = opendir(e->ledger_dirs[d]);
        if (!dd)
            continue;
        struct dirent *de;
        while ((de = readdir(dd))) {
            char *endp;
            unsigned long id = strtoul(de->d_name, &endp, 16);
            if (strlen(de->d_name) != 12 || endp != de->d_name + 8 || id == 0 ||
                (strcmp(endp, ".log") != 0 && strcmp(endp, ".idx") != 0))
                continue;
            if (id > maxid)
                maxid = (uint32_t)id; /* (never reuse the id of a file just removed) */
            if (log_find(e, (uint32_t)id))
                continue;
            if (unlinkat(dirfd(dd), de->d_name, 0) < 0 && errno != ENOENT) {
                seterr(e, "cannot remove unlisted entry log file %s/%s: %s", e->ledger_dirs[d], de->d_name,
                       strerror(errno));
                rc = E_IO;
                break;
            }
        }
        closedir(dd);
        fsync_dir(e->ledger_dirs[d]);
    }
    e->next_log_id = maxid + 1;
    free(rl.v);
    return rc;
}

static void replay_record(Engine *e, uint32_t type, const unsigned char *p, uint32_t len)
{
    Ledger *l = NULL;
    if (len < 8 || led_lookup(e, get64(p), &l) != E_OK) {
        e->replay_failed = 1; /* an index read failed: open fails rather than skip a record */
        return;
    }
    if (type == JR_ADD && len >= 16) {
        uint64_t lid = get64(p);
        int64_t entry = (int64_t)get64(p + 8);
        if (!l)
            l = led_create(e, lid, 0);
        uint64_t off;
        uint32_t bl = len - 16;
        if (!l || cache_put(&e->cache[e->active], lid, l->inc, entry, p + 16, bl, log_crc(lid, entry, p + 16, bl), 1,
                            &off) < 0 ||
            loc_set(l, entry, WHERE_CACHE0 + (uint32_t)e->active, bl, off) < 0)
            e->replay_failed = 1;
    } else if ((type == JR_MKEY || type == JR_FENCE) && len >= 18) {
        uint64_t lid = get64(p), inc = get64(p + 8);
        uint16_t kl;
        memcpy(&kl, p + 16, 2);
        if (kl > MAX_KEY || 18u + kl > len)
            return;
        if (!l)
            l = led_create(e, lid, inc);
        if (inc >= e->next_inc)
            e->next_inc = inc + 1;
        if (!l || (!l->has_key && led_set_key(l, p + 18, kl) < 0)) {
            e->replay_failed = 1;
            return;
        }
        if (type == JR_FENCE)
            l->fenced = 1;
        led_dirty(e, l);
    } else if (type == JR_LAC && l) {
        unsigned char *lac = malloc(len - 8 ? len - 8 : 1);
        if (!lac) {
            e->replay_failed = 1;
            return;
        }
        memcpy(lac, p + 8, len - 8);
        free(l->lac);
        l->lac = lac;
        l->laclen = len - 8;
        l->has_lac = 1;
        led_dirty(e, l);
    } else if (type == JR_DELETE && l) {
        led_delete(e, l);
    }
}

/* is there a complete group with valid checksums at `off`? */
static int group_ok(const unsigned char *m, size_t off, size_t sz, uint64_t jid)
{
    unsigned char idb[8];
    put64(idb, jid);
    if (off + JG_HDR > sz || memcmp(m + off, "BKSG", 4) != 0 || get64(m + off + 12) != off ||
        get32(m + off + 20) != bks_crc32c(bks_crc32c(0, idb, 8), m + off, 20))
        return 0;
    uint32_t len = get32(m + off + 4);
    if (len < JR_HDR || off + JG_HDR + len > sz)
        return 0;
    return get32(m + off + 8) == bks_crc32c(0, m + off + JG_HDR, len);
}

/* offset of the next valid group at or after `off`, or sz */
static size_t next_group(const unsigned char *m, size_t off, size_t sz, uint64_t jid)
{
    while (off + JG_HDR <= sz) {
        const unsigned char *q = memchr(m + off, 'B', sz - off);
        if (!q)
            return sz;
        off = (size_t)(q - m);
        if (group_ok(m, off, sz, jid))
            return off;
        off++;
    }
    return sz;
}

/* Does [a, b) touch space a torn write did not reach?  A group is written where the file reads as
 * zeros (zeroed or fallocated ahead, or the padding after the previous group), so a sector the
 * write never reached still reads as zeros from `lo` (the group's start: bytes before it belong to
 * the previous, synced group) to its end; bytes past the end of the file were not reached either. */
static int j_unwritten(const unsigned char *m, size_t sz, size_t lo, uint64_t a, uint64_t b)
{
    if (b > sz)
        return 1;
    for (size_t s = (size_t)a & ~(size_t)(J_SECTOR - 1); s < b; s += J_SECTOR) {
        size_t i = s > lo ? s : lo, y = s + J_SECTOR < sz ? s + J_SECTOR : sz;
        while (i < y && m[i] == 0)
            i++;
        if (i == y)
            return 1;
    }
    return 0;
}

/* Could a crash have left the bytes at `off` (after the last valid group of a synced file, no
 * valid group after them)?  Each group is written only after the previous one was synced, so a
 * crash leaves at most the one group it interrupted, each of its sectors either written or still
 * zero.  Yes (1) when the group header is unwritten (that covers a tail of zeros), or when the
 * header is intact and every record failing its checksum touches an unwritten sector; no (0) when
 * written bytes fail a checksum: a header that is not a valid one, a bad record in written
 * sectors -- a fully written group that fails its checksum is corruption, not a tear.  *gend: the
 * group's end if its header is intact, else 0. */
static int j_torn_tail(const unsigned char *m, size_t off, size_t sz, uint64_t jid, uint64_t *gend)
{
    unsigned char idb[8];
    put64(idb, jid);
    *gend = 0;
    if (j_unwritten(m, sz, off, off, off + JG_HDR))
        return 1;
    if (memcmp(m + off, "BKSG", 4) != 0 || get64(m + off + 12) != off ||
        get32(m + off + 20) != bks_crc32c(bks_crc32c(0, idb, 8), m + off, 20))
        return 0;
    uint64_t end = (uint64_t)off + JG_HDR + get32(m + off + 4), r = off + JG_HDR;
    int torn = 0;
    *gend = end;
    while (r < end) {
        if (j_unwritten(m, sz, off, r, r + JR_HDR))
            return 1; /* the records from here on are unknown: the write never reached them */
        uint32_t len = get32(m + r), type = get32(m + r + 4);
        if (end - r < JR_HDR || len == 0 || len > end - r - JR_HDR || type < JR_ADD || type > JR_DELETE)
            return 0;
        uint64_t rend = r + JR_HDR + len;
        if (rend > sz)
            return 1;
        if (bks_crc32c(bks_crc32c(0, m + r, 8), m + r + JR_HDR, len) != get32(m + r + 8)) {
            if (!j_unwritten(m, sz, off, r, rend))
                return 0;
            torn = 1;
        }
        r = rend;
    }
    return torn; /* every record intact, yet the group checksum fails: not a tear */
}

/* Replay journal j's files from its own LastLogMark (all of them when it has none). */
int replay_journals(Engine *e, Journal *j, uint64_t *maxid)
{
    size_t n;
    int have_mark = j->have_mark;
    uint64_t *ids = list_journals(j, &n);
    if (!ids) { /* not "no journals": replaying nothing would lose acknowledged entries */
        seterr(e, "cannot list journal directory %s: %s", j->dir, strerror(errno));
        return E_IO;
    }
    *maxid = j->mark_id;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = ids[i];
        if (id > *maxid)
            *maxid = id;
        if (have_mark && id < j->mark_id)
            continue;
        char p[4200];
        jpath(j, id, p, sizeof p);
        int fd = open(p, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        fstat(fd, &st);
        size_t sz = (size_t)st.st_size;
        if (sz < J_HDR) {
            e->st_replay_truncated += sz;
            close(fd);
            continue;
        }
        unsigned char *m = mmap(NULL, sz, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            free(ids);
            seterr(e, "cannot map journal %s: %s", p, strerror(errno));
            return E_IO;
        }
        if (memcmp(m, J_MAGIC, 4) != 0 || get32(m + 4) != J_VERSION || get64(m + 8) != id ||
            get32(m + 20) != bks_crc32c(0, m, 20)) {
            /* Header never made durable: nothing in it was acknowledged -- unless the file holds
             * a valid group (its header checksum covers the file id, known from the name): groups
             * are written only once the header is synced, so that header was damaged later. */
            uint64_t mark = have_mark && id == j->mark_id ? j->mark_pos : J_HDR;
            for (size_t k = next_group(m, J_HDR, sz, id); k < sz;) {
                size_t gend = k + JG_HDR + get32(m + k + 4);
                if (gend > mark) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s has a corrupt header but holds a valid group at offset %zu: acknowledged "
                              "records would be lost; refusing to start (restore the journal, or decommission "
                              "this bookie so that its ledgers are re-replicated)", p, k);
                    return E_IO;
                }
                k = next_group(m, gend, sz, id);
            }
            munmap(m, sz);
            close(fd);
            e->st_replay_truncated += sz;
            continue;
        }
        int synced_file = (get32(m + 16) & JF_SYNC) != 0;
        /* records before `mark` are already in the entry logs (`from`: the same within the file) */
        uint64_t mark = have_mark && id == j->mark_id ? j->mark_pos : J_HDR;
        size_t from = mark < sz ? (size_t)mark : sz;
        /* Walk the groups from the start (the mark may fall inside a group). Groups are
         * self-delimiting (magic + checksums), so after a bad spot we look for the next valid
         * group. Each group is written only after the previous one was fdatasync'ed, so in a
         * synced journal a valid group *after* a bad spot means synced data was damaged: if the
         * damage reaches past the LastLogMark, acknowledged records would be lost -- refuse to
         * start. A bad spot with no valid group after it is the preallocated zeros or the group a
         * crash tore (never acknowledged): cut it. But a last group whose written bytes fail a
         * checksum is damage, not a tear (j_torn_tail): its records were acknowledged and exist
         * nowhere else, so unless the mark has passed it, refuse to start. */
        size_t off = J_HDR, end = J_HDR;
        while (off < sz) {
            if (!group_ok(m, off, sz, id)) {
                size_t k = next_group(m, off + 1, sz, id);
                if (k >= sz && synced_file) {
                    uint64_t gend;
                    int torn = j_torn_tail(m, off, sz, id, &gend);
                    if (!torn || mark > off) { /* a group the mark has passed into was synced: not torn */
                        if (!gend) { /* extent unknown: up to its last non-zero byte */
                            gend = sz;
                            while (gend > off && m[gend - 1] == 0)
                                gend--;
                        }
                        if (gend > mark) { /* (a file cut short below the mark lost nothing) */
                            munmap(m, sz);
                            close(fd);
                            free(ids);
                            seterr(e, "journal %s is corrupt at offset %zu: the group there fails its checksum, and "
                                      "not as a torn write leaves one (the sectors it did not reach zeroed); it holds "
                                      "records past the LastLogMark: acknowledged records would be lost; refusing to "
                                      "start (inspect it with `bkspark shell readjournal`; restore it, or decommission "
                                      "this bookie so that its ledgers are re-replicated)",
                                   p, off);
                            return E_IO;
                        }
                    }
                }
                if (k >= sz)
                    break;
                if (synced_file && k > from) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s is corrupt at offset %zu but holds valid synced data at offset %zu: "
                              "acknowledged records would be lost; refusing to start (repair or restore the "
                              "journal manually)", p, off, k);
                    return E_IO;
                }
                off = k;
                continue;
            }
            size_t gend = off + JG_HDR + get32(m + off + 4);
            size_t r = off + JG_HDR;
            while (r < gend) {
                int ok = r + JR_HDR <= gend;
                uint32_t len = ok ? get32(m + r) : 0, type = ok ? get32(m + r + 4) : 0;
                ok = ok && len > 0 && len <= gend - r - JR_HDR && type >= JR_ADD && type <= JR_DELETE &&
                     bks_crc32c(bks_crc32c(0, m + r, 8), m + r + JR_HDR, len) == get32(m + r + 8);
                if (!ok) {
                    munmap(m, sz);
                    close(fd);
                    free(ids);
                    seterr(e, "journal %s: bad record at offset %zu inside a group whose checksum matches", p, r);
                    return E_IO;
                }
                if (r >= from) {
                    replay_record(e, type, m + r + JR_HDR, len);
                    e->st_replay_records++;
                }
                r += JR_HDR + len;
            }
            off = end = gend;
        }
        off = end;
        int garbage = 0;
        for (size_t k = off; k < sz && !garbage; k++)
            garbage = m[k] != 0;
        if (garbage)
            e->st_replay_truncated += sz - off;
        munmap(m, sz);
        if (off < sz && ftruncate(fd, (off_t)off) == 0)
            fdatasync(fd);
        close(fd);
    }
    free(ids);
    if (e->replay_failed) {
        char why[sizeof e->errmsg];
        memcpy(why, e->errmsg, sizeof why);
        seterr(e, "journal replay could not apply a record (%s); refusing to start", why[0] ? why : "out of memory");
        return E_IO;
    }
    return E_OK;
}

/* The LastLogMark of every journal: the highest valid one over the ledger dirs (none valid: that
 * journal is replayed whole).  Returns whether any journal has one, or -1 (refuse to start,
 * errmsg set) when the marks show that the journal count changed: journal 0's lastMark without
 * a lastMark.<k> of a configured journal k (a checkpoint writes lastMark last), or a lastMark.<k>
 * for a journal not configured -- a ledger's records would be looked for in the wrong journal.
 * (The cookie refuses such a configuration first; this guards the engine used directly.) */
static int read_mark_file(Engine *e, int k, uint64_t *id_out, uint64_t *pos_out)
{
    char name[32];
    mark_name(k, name, sizeof name);
    int have = 0;
    for (int d = 0; d < e->nldirs; d++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", e->ledger_dirs[d], name);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        unsigned char m[32];
        int ok = read_full(fd, m, 32, 0) == 0 && memcmp(m, M_MAGIC, 4) == 0 && get32(m + 24) == bks_crc32c(0, m, 24);
        close(fd);
        if (!ok)
            continue; /* unusable mark: replaying more journal is always safe */
        uint64_t id = get64(m + 8), pos = get64(m + 16);
        if (!have || id > *id_out || (id == *id_out && pos > *pos_out)) {
            *id_out = id;
            *pos_out = pos;
        }
        have = 1;
    }
    return have;
}

/* whether `name` is a journal renamed for the reaper: <16 hex digits>.txn + REAP_SUFFIX */
static int reaped_name(const char *name)
{
    if (strlen(name) != 16 + strlen(".txn" REAP_SUFFIX))
        return 0;
    for (int i = 0; i < 16; i++)
        if (!isxdigit((unsigned char)name[i]))
            return 0;
    return strcmp(name + 16, ".txn" REAP_SUFFIX) == 0;
}

/* Call cb(e, path) for each journal renamed for the reaper (older than its mark: nothing reads it)
 * in the journal directories, until it returns nonzero. */
void each_reaped_journal(Engine *e, int (*cb)(Engine *, const char *))
{
    for (int k = 0; k < e->njournals; k++) {
        DIR *d = opendir(e->jn[k]->dir);
        if (!d)
            continue;
        struct dirent *de;
        int stop = 0;
        while (!stop && (de = readdir(d))) {
            char p[4300];
            if (!reaped_name(de->d_name))
                continue;
            snprintf(p, sizeof p, "%s/%s", e->jn[k]->dir, de->d_name);
            stop = cb(e, p);
        }
        closedir(d);
        if (stop)
            return;
    }
}

int unlink_reaped(Engine *e, const char *path)
{
    (void)e;
    unlink(path);
    return 0;
}

int read_lastmark(Engine *e)
{
    int any = 0;
    for (int k = 0; k < e->njournals; k++) {
        Journal *j = e->jn[k];
        j->have_mark = read_mark_file(e, k, &j->mark_id, &j->mark_pos);
        any |= j->have_mark;
    }
    for (int k = 1; k < e->njournals && e->jn[0]->have_mark; k++) {
        if (!e->jn[k]->have_mark) {
            seterr(e, "%s/lastMark exists but no lastMark.%d: this bookie was written with fewer than the %d "
                      "configured journal directories; refusing to start (configure the journal directories it "
                      "was written with, in the same order)", e->ledger_dirs[0], k, e->njournals);
            return -1;
        }
    }
    uint64_t id, pos;
    if (read_mark_file(e, e->njournals, &id, &pos)) {
        seterr(e, "found lastMark.%d in the ledger dirs: this bookie was written with more than the %d configured "
                  "journal directories; refusing to start (configure the journal directories it was written with, "
                  "in the same order)", e->njournals, e->njournals);
        return -1;
    }
    return any;
}
