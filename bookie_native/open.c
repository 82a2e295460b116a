/* bkspark bookie storage engine: recovery at open (state file, entry logs + index files, journal replay). */
#define _GNU_SOURCE
#include "engine_int.h"

/* ---------------------------------------------------------------- open: state, logs, index, replay */
int load_state(Engine *e, Listed **listed, size_t *nlisted, int *found)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/ledgers.state", e->ledger_dirs[0]);
    *found = 0;
    *listed = NULL;
    *nlisted = 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return E_OK;
        seterr(e, "cannot open %s: %s", p, strerror(errno));
        return E_IO;
    }
    struct stat st;
    fstat(fd, &st);
    size_t n = (size_t)st.st_size;
    unsigned char *b = malloc(n ? n : 1);
    if (!b || read_full(fd, b, n, 0) < 0) {
        close(fd);
        free(b);
        seterr(e, "cannot read %s", p);
        return E_IO;
    }
    close(fd);
    *found = 1;
    if (n < 32 || memcmp(b, S_MAGIC, 4) != 0 || get32(b + 4) != S_VERSION ||
        get32(b + n - 4) != bks_crc32c(0, b, n - 4)) {
        free(b);
        seterr(e, "ledger state file %s is corrupt (bad magic/version/checksum); refusing to start "
                  "without fencing state", p);
        return E_IO;
    }
    e->next_inc = get64(b + 8);
    uint32_t nl = get32(b + 16);
    uint64_t nled = get64(b + 20);
    const unsigned char *q = b + 28, *end = b + n - 4;
    if ((size_t)(end - q) < (size_t)nl * 20)
        goto bad;
    *listed = calloc(nl ? nl : 1, sizeof(Listed));
    for (uint32_t i = 0; i < nl; i++, q += 20) {
        (*listed)[i].id = get32(q);
        (*listed)[i].size = get64(q + 4);
        (*listed)[i].idx_size = get64(q + 12);
    }
    *nlisted = nl;
    for (uint64_t i = 0; i < nled; i++) {
        if (end - q < 19)
            goto bad;
        uint64_t id = get64(q), inc = get64(q + 8);
        unsigned flags = q[16];
        uint16_t kl;
        memcpy(&kl, q + 17, 2);
        if (kl > MAX_KEY || end - q < 19 + kl + 4)
            goto bad;
        Ledger *l = ledger_create(e, id, inc);
        l->has_key = flags & 1;
        l->fenced = (flags & 2) != 0;
        l->keylen = kl;
        memcpy(l->key, q + 19, kl);
        q += 19 + kl;
        uint32_t ll = get32(q);
        q += 4;
        if ((size_t)(end - q) < ll)
            goto bad;
        if (flags & 4) {
            l->has_lac = 1;
            l->lac = malloc(ll ? ll : 1);
            memcpy(l->lac, q, ll);
            l->laclen = ll;
        }
        q += ll;
    }
    if (q != end)
        goto bad; /* record count and size disagree */
    if (e->next_inc == 0)
        e->next_inc = 1;
    free(b);
    return E_OK;
bad:
    free(b);
    seterr(e, "ledger state file %s is malformed", p);
    return E_IO;
}

/* A log the ledger state does not list and whose header or index header is torn was being
 * created when the bookie died: log_create writes both headers before anything else goes in,
 * so it holds no entry, and the journal (not yet checkpointed past it) covers whatever was
 * meant for it.  Remove its files: adopting it would list an index that was never written,
 * and the next start would refuse it. */
static int discard_torn_log(Engine *e, const char *log_path, const char *idx_path)
{
    if ((unlink(log_path) < 0 && errno != ENOENT) || (unlink(idx_path) < 0 && errno != ENOENT)) {
        seterr(e, "cannot remove entry log %s, torn at creation: %s", log_path, strerror(errno));
        return E_IO;
    }
    return E_OK;
}

static int load_log(Engine *e, int dir, uint32_t id, const Listed *li)
{
    char p[4200], q[4200];
    lpath(e, dir, id, "log", p, sizeof p);
    lpath(e, dir, id, "idx", q, sizeof q);
    LogFile *lf = calloc(1, sizeof *lf);
    lf->id = id;
    lf->dir = dir;
    lf->dfd = -1;
    lf->fd = open(p, O_RDWR | O_CLOEXEC);
    lf->idx_fd = open(q, O_RDWR | O_CLOEXEC);
    unsigned char h[L_HDR];
    struct stat st;
    int ok = lf->fd >= 0 && read_full(lf->fd, h, L_HDR, 0) == 0 && check_header(h, L_HDR, L_MAGIC, id);
    if (!ok) {
        if (li) {
            seterr(e, "entry log %s is missing or has a corrupt header", p);
            log_release(lf);
            return E_IO;
        }
        log_release(lf); /* unlisted, torn at creation */
        return discard_torn_log(e, p, q);
    }
    fstat(lf->fd, &st);
    log_open_direct(e, lf, p);
    lf->size = (uint64_t)st.st_size;
    lf->total = lf->size - L_HDR;
    unsigned char *ib = NULL;
    size_t isz = 0;
    if (lf->idx_fd >= 0 && fstat(lf->idx_fd, &st) == 0) {
        isz = (size_t)st.st_size;
        ib = malloc(isz ? isz : 1);
        if (read_full(lf->idx_fd, ib, isz, 0) < 0)
            isz = 0;
    }
    uint64_t committed = li ? li->idx_size : 0;
    if (isz < I_HDR || !check_header(ib, I_HDR, I_MAGIC, id) || isz < committed) {
        if (li) {
            seterr(e, "entry log index %s is missing, truncated (%zu < %llu bytes) or has a corrupt header", q, isz,
                   (unsigned long long)committed);
            free(ib);
            log_release(lf);
            return E_IO;
        }
        free(ib);
        log_release(lf); /* unlisted, killed between the log's and the index's header */
        return discard_torn_log(e, p, q);
    }
    logs_insert(e, lf);
    size_t off = I_HDR;
    while (isz && off + 8 <= isz) {
        uint32_t cnt = get32(ib + off);
        size_t bl = (size_t)cnt * IR_SIZE;
        if (cnt == 0 || off + 8 + bl > isz ||
            get32(ib + off + 4) != bks_crc32c(bks_crc32c(0, ib + off, 4), ib + off + 8, bl)) {
            if (off < committed) {
                seterr(e, "entry log index %s corrupt at offset %zu (inside the checkpointed part)", q, off);
                free(ib);
                return E_IO;
            }
            break; /* torn tail of an unfinished checkpoint: the journal still covers it */
        }
        for (uint32_t k = 0; k < cnt; k++) {
            const unsigned char *r = ib + off + 8 + (size_t)k * IR_SIZE;
            Ledger *l = eng_find(e, get64(r));
            if (!l || l->inc != get64(r + 16))
                continue;
            loc_set(e, l, (int64_t)get64(r + 8), id, get32(r + 32), get64(r + 24));
        }
        off += 8 + bl;
    }
    lf->idx_size = off;
    free(ib);
    return E_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* An index whose log is gone (a kill between a removal's two unlinks) serves nothing: remove it,
 * or it would stay forever (only .log files are looked for) and a new log of its id could
 * meet it. */
static void drop_orphan_index(DIR *dd, const char *idx_name)
{
    char log_name[13];
    memcpy(log_name, idx_name, 8);
    strcpy(log_name + 8, ".log");
    if (faccessat(dirfd(dd), log_name, F_OK, 0) < 0 && errno == ENOENT)
        unlinkat(dirfd(dd), idx_name, 0);
}

int load_logs(Engine *e, Listed *listed, size_t nlisted)
{
    /* (id, dir) of every *.log file */
    size_t cap = 64, n = 0;
    uint32_t *ids = malloc(cap * sizeof *ids * 2);
    if (!ids) {
        seterr(e, "out of memory listing entry logs");
        return E_IO;
    }
    for (int d = 0; d < e->nldirs; d++) {
        DIR *dd = opendir(e->ledger_dirs[d]);
        if (!dd)
            continue;
        struct dirent *de;
        while ((de = readdir(dd))) {
            if (strlen(de->d_name) != 12)
                continue;
            char *end;
            unsigned long id = strtoul(de->d_name, &end, 16);
            if (end != de->d_name + 8 || id == 0)
                continue;
            if (strcmp(de->d_name + 8, ".idx") == 0)
                drop_orphan_index(dd, de->d_name);
            if (strcmp(de->d_name + 8, ".log") != 0)
                continue;
            if (n == cap) {
                uint32_t *p = realloc(ids, cap * 2 * sizeof *ids * 2);
                if (!p) {
                    closedir(dd);
                    free(ids);
                    seterr(e, "out of memory listing entry logs");
                    return E_IO;
                }
                ids = p;
                cap *= 2;
            }
            ids[2 * n] = (uint32_t)id;
            ids[2 * n + 1] = (uint32_t)d;
            n++;
        }
        closedir(dd);
    }
    qsort(ids, n, sizeof *ids * 2, cmp_u32);
    uint32_t maxid = 0;
    for (size_t i = 0; i < nlisted; i++) {
        int present = 0;
        for (size_t k = 0; k < n; k++)
            if (ids[2 * k] == listed[i].id)
                present = 1;
        if (!present) {
            seterr(e, "entry log %08x.log is listed in the ledger state but missing from every ledger dir",
                   listed[i].id);
            free(ids);
            return E_IO;
        }
        if (listed[i].id > maxid)
            maxid = listed[i].id;
    }
    for (size_t k = 0; k < n; k++) {
        const Listed *li = NULL;
        for (size_t i = 0; i < nlisted; i++)
            if (listed[i].id == ids[2 * k])
                li = &listed[i];
        int rc = load_log(e, (int)ids[2 * k + 1], ids[2 * k], li);
        if (rc != E_OK) {
            free(ids);
            return rc;
        }
        if (ids[2 * k] > maxid)
            maxid = ids[2 * k];
    }
    e->next_log_id = maxid + 1;
    free(ids);
    return E_OK;
}

static void replay_record(Engine *e, uint32_t type, const unsigned char *p, uint32_t len)
{
    if (type == JR_ADD && len >= 16) {
        uint64_t lid = get64(p);
        int64_t entry = (int64_t)get64(p + 8);
        Ledger *l = eng_find(e, lid);
        if (!l)
            l = ledger_create(e, lid, e->next_inc);
        uint64_t off;
        uint32_t bl = len - 16;
        if (cache_put(&e->cache[e->active], lid, l->inc, entry, p + 16, bl, log_crc(lid, entry, p + 16, bl), 1,
                      &off) == 0)
            loc_set(e, l, entry, WHERE_CACHE0 + (uint32_t)e->active, bl, off);
    } else if ((type == JR_MKEY || type == JR_FENCE) && len >= 18) {
        uint64_t lid = get64(p), inc = get64(p + 8);
        uint16_t kl;
        memcpy(&kl, p + 16, 2);
        if (kl > MAX_KEY || 18u + kl > len)
            return;
        Ledger *l = eng_find(e, lid);
        if (!l)
            l = ledger_create(e, lid, inc);
        if (inc >= e->next_inc)
            e->next_inc = inc + 1;
        if (!l->has_key) {
            l->has_key = 1;
            l->keylen = kl;
            memcpy(l->key, p + 18, kl);
        }
        if (type == JR_FENCE)
            l->fenced = 1;
    } else if (type == JR_LAC && len >= 8) {
        Ledger *l = eng_find(e, get64(p));
        if (l) {
            free(l->lac);
            l->laclen = len - 8;
            l->lac = malloc(l->laclen ? l->laclen : 1);
            memcpy(l->lac, p + 8, l->laclen);
            l->has_lac = 1;
        }
    } else if (type == JR_DELETE && len >= 8) {
        ledger_remove(e, get64(p));
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

int replay_journals(Engine *e, int have_mark, uint64_t *maxid)
{
    size_t n;
    uint64_t *ids = list_journals(e, &n);
    if (!ids) { /* not "no journals": replaying nothing would lose acknowledged entries */
        seterr(e, "cannot list journal directory %s: %s", e->journal_dir, strerror(errno));
        return E_IO;
    }
    *maxid = e->mark_id;
    for (size_t i = 0; i < n; i++) {
        uint64_t id = ids[i];
        if (id > *maxid)
            *maxid = id;
        if (have_mark && id < e->mark_id)
            continue;
        char p[4200];
        jpath(e, id, p, sizeof p);
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
            uint64_t mark = have_mark && id == e->mark_id ? e->mark_pos : J_HDR;
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
        uint64_t mark = have_mark && id == e->mark_id ? e->mark_pos : J_HDR;
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
    return E_OK;
}

int read_lastmark(Engine *e)
{
    int have = 0;
    for (int d = 0; d < e->nldirs; d++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/lastMark", e->ledger_dirs[d]);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        unsigned char m[32];
        int ok = read_full(fd, m, 32, 0) == 0 && memcmp(m, M_MAGIC, 4) == 0 && get32(m + 24) == bks_crc32c(0, m, 24);
        close(fd);
        if (!ok)
            continue; /* unusable mark: replaying more journal is always safe */
        uint64_t id = get64(m + 8), pos = get64(m + 16);
        if (!have || id > e->mark_id || (id == e->mark_id && pos > e->mark_pos)) {
            e->mark_id = id;
            e->mark_pos = pos;
        }
        have = 1;
    }
    return have;
}
