/* bkspark bookie storage engine: the test-only I/O fault layer under the engine's system calls (iofault.h
 * says what it models).  Everything here is guarded by one mutex, taken only while armed. */
#define _GNU_SOURCE
#define BKS_IOFAULT_IMPL
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iofault.h"

#define MAX_RULES 64

typedef struct {
    int op, err, lose, short_write;
    char path[256];
    long after, times, seen, fired;
    long long at; /* read only: fire only for a read whose bytes include this offset (-1: any) */
} Rule;

/* a file's bytes written since its last successful fdatasync/fsync: sorted, disjoint ranges; and
 * its writeback errors as Linux keeps them (errseq): a counter, each descriptor remembering the
 * count it has reported (taken at open), so every descriptor open at a failure sees it once */
typedef struct Unsynced {
    char *path;
    uint64_t *lo, *hi;
    size_t n, cap;
    long err_seq;
    int err;
    struct Unsynced *next;
} Unsynced;

static const char *op_names[IOF_NOPS] = {"open", "write", "sync_range", "sync", "rename", "fallocate", "read"};

static int armed;  /* rules or tracking present: the wrappers take the slow path */
static int tracking;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Rule rules[MAX_RULES];
static int nrules;
static long fired[IOF_NOPS];
static long lost_bytes;
static Unsynced *files;
/* the path each descriptor names (kept armed or not: a test arms the layer after the engine opened),
 * and the writeback errors of its file it has reported (errseq, above) */
static char **fd_paths;
static long *fd_seen;
static size_t nfd_paths;

static Unsynced *unsynced_of(const char *path, int create);

static void set_armed(void) { __atomic_store_n(&armed, nrules > 0 || tracking, __ATOMIC_RELEASE); }
static int is_armed(void) { return __atomic_load_n(&armed, __ATOMIC_RELAXED); }

static void remember_fd(int fd, const char *path)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&mu);
    if ((size_t)fd >= nfd_paths) {
        size_t n = nfd_paths ? nfd_paths : 256;
        while (n <= (size_t)fd)
            n *= 2;
        char **p = realloc(fd_paths, n * sizeof *p);
        if (p)
            fd_paths = p;
        long *q = p ? realloc(fd_seen, n * sizeof *q) : NULL;
        if (q)
            fd_seen = q;
        if (p && q) {
            memset(p + nfd_paths, 0, (n - nfd_paths) * sizeof *p);
            memset(q + nfd_paths, 0, (n - nfd_paths) * sizeof *q);
            nfd_paths = n;
        }
    }
    if ((size_t)fd < nfd_paths) {
        free(fd_paths[fd]);
        fd_paths[fd] = strdup(path);
        Unsynced *u = unsynced_of(path, 0);
        fd_seen[fd] = u ? u->err_seq : 0; /* (a descriptor opened after a failure does not see it) */
    }
    pthread_mutex_unlock(&mu);
}

static const char *fd_path(int fd) /* mu held */
{
    return fd >= 0 && (size_t)fd < nfd_paths && fd_paths[fd] ? fd_paths[fd] : "";
}

/* The rule that fails this call, if any (mu held). */
/* the rule that fires for this call (`off`, `n`: the bytes a read asks for; -1, 0 otherwise) */
static Rule *match_at(int op, const char *path, long long off, size_t n)
{
    for (int i = 0; i < nrules; i++) {
        Rule *r = &rules[i];
        if (r->op != op || !strstr(path, r->path))
            continue;
        if (r->at >= 0 && (off < 0 || r->at < off || r->at >= off + (long long)n))
            continue;
        r->seen++;
        if (r->seen > r->after && (r->times < 0 || r->fired < r->times)) {
            r->fired++;
            fired[op]++;
            return r;
        }
    }
    return NULL;
}

static Rule *match(int op, const char *path) { return match_at(op, path, -1, 0); }

static Unsynced *unsynced_of(const char *path, int create) /* mu held */
{
    for (Unsynced *u = files; u; u = u->next)
        if (strcmp(u->path, path) == 0)
            return u;
    if (!create)
        return NULL;
    Unsynced *u = calloc(1, sizeof *u);
    if (!u || !(u->path = strdup(path))) {
        free(u);
        return NULL;
    }
    u->next = files;
    files = u;
    return u;
}

/* Add [lo, hi) to the file's unsynced bytes, merging what it touches (mu held). */
static void note_write(const char *path, uint64_t lo, uint64_t hi)
{
    if (!tracking || !*path || hi <= lo)
        return;
    Unsynced *u = unsynced_of(path, 1);
    if (!u)
        return;
    size_t i = 0;
    while (i < u->n && u->hi[i] < lo)
        i++;
    size_t j = i;
    while (j < u->n && u->lo[j] <= hi) {
        if (u->lo[j] < lo)
            lo = u->lo[j];
        if (u->hi[j] > hi)
            hi = u->hi[j];
        j++;
    }
    if (j == i) { /* insert at i */
        if (u->n == u->cap) {
            size_t nc = u->cap ? u->cap * 2 : 16;
            uint64_t *a = realloc(u->lo, nc * sizeof *a), *b = a ? realloc(u->hi, nc * sizeof *b) : NULL;
            if (a)
                u->lo = a;
            if (!b)
                return;
            u->hi = b;
            u->cap = nc;
        }
        memmove(u->lo + i + 1, u->lo + i, (u->n - i) * sizeof *u->lo);
        memmove(u->hi + i + 1, u->hi + i, (u->n - i) * sizeof *u->hi);
        u->n++;
    } else if (j > i + 1) { /* ranges i..j-1 merge into i */
        memmove(u->lo + i + 1, u->lo + j, (u->n - j) * sizeof *u->lo);
        memmove(u->hi + i + 1, u->hi + j, (u->n - j) * sizeof *u->hi);
        u->n -= j - i - 1;
    }
    u->lo[i] = lo;
    u->hi[i] = hi;
}

/* Lose the file's unsynced bytes within [lo, hi): zeros where they were (through a descriptor of
 * our own, so that an O_DIRECT one needs no alignment), durable, then forgotten (mu held). */
static void lose(const char *path, uint64_t lo, uint64_t hi)
{
    Unsynced *u = unsynced_of(path, 0);
    if (!u)
        return;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    struct stat st;
    uint64_t size = fd >= 0 && fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    static const unsigned char zeros[65536];
    size_t k = 0;
    for (size_t i = 0; i < u->n; i++) {
        uint64_t a = u->lo[i] > lo ? u->lo[i] : lo, b = u->hi[i] < hi ? u->hi[i] : hi;
        if (b > size)
            b = size;
        for (uint64_t p = a; fd >= 0 && p < b;) {
            size_t len = b - p > sizeof zeros ? sizeof zeros : (size_t)(b - p);
            ssize_t w = pwrite(fd, zeros, len, (off_t)p);
            if (w <= 0)
                break;
            p += (uint64_t)w;
            lost_bytes += w;
        }
        /* keep what lies outside [lo, hi) */
        if (u->lo[i] < lo) {
            u->lo[k] = u->lo[i];
            u->hi[k++] = lo < u->hi[i] ? lo : u->hi[i];
        }
        if (u->hi[i] > hi) {
            u->lo[k] = hi > u->lo[i] ? hi : u->lo[i];
            u->hi[k++] = u->hi[i];
        }
    }
    u->n = k;
    if (fd >= 0) {
        fdatasync(fd);
        close(fd);
    }
}

/* A sync succeeded: forget the unsynced ranges it covered -- those of `snap` (taken before it
 * began; a write racing the sync, such as a journal group beside the zeroer's sync, stays) (mu held). */
static void synced(const char *path, const uint64_t *slo, const uint64_t *shi, size_t sn)
{
    Unsynced *u = unsynced_of(path, 0);
    if (!u)
        return;
    for (size_t k = 0; k < sn; k++) {
        size_t m = 0;
        uint64_t *nlo = malloc((u->n * 2 + 1) * sizeof *nlo), *nhi = malloc((u->n * 2 + 1) * sizeof *nhi);
        if (!nlo || !nhi) {
            free(nlo);
            free(nhi);
            return;
        }
        for (size_t i = 0; i < u->n; i++) { /* u[i] minus [slo[k], shi[k]) */
            if (u->hi[i] <= slo[k] || u->lo[i] >= shi[k]) {
                nlo[m] = u->lo[i];
                nhi[m++] = u->hi[i];
                continue;
            }
            if (u->lo[i] < slo[k]) {
                nlo[m] = u->lo[i];
                nhi[m++] = slo[k];
            }
            if (u->hi[i] > shi[k]) {
                nlo[m] = shi[k];
                nhi[m++] = u->hi[i];
            }
        }
        free(u->lo);
        free(u->hi);
        u->lo = nlo;
        u->hi = nhi;
        u->n = m;
        u->cap = u->n * 2 + 1;
    }
}

/* A writeback error of the file this descriptor has not reported yet (errseq): its errno, or 0 (mu held). */
static int unseen_error(int fd, const char *path)
{
    Unsynced *u = unsynced_of(path, 0);
    if (!u || fd < 0 || (size_t)fd >= nfd_paths || fd_seen[fd] >= u->err_seq)
        return 0;
    fd_seen[fd] = u->err_seq;
    return u->err;
}

/* The errno a rule fails this call of `op` on `path` (fd < 0) or on descriptor `fd` with, 0 if none. */
static int call_fault(int op, const char *path, int fd)
{
    pthread_mutex_lock(&mu);
    Rule *r = match(op, fd >= 0 ? fd_path(fd) : path);
    int err = r ? r->err : 0;
    pthread_mutex_unlock(&mu);
    return err;
}

/* ---------------------------------------------------------------- the wrappers */
int bks_io_open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int err = is_armed() ? call_fault(IOF_OPEN, path, -1) : 0;
    if (err) {
        errno = err;
        return -1;
    }
    int fd = open(path, flags, mode);
    remember_fd(fd, path);
    return fd;
}

int bks_io_close(int fd)
{
    pthread_mutex_lock(&mu);
    if (fd >= 0 && (size_t)fd < nfd_paths) {
        free(fd_paths[fd]);
        fd_paths[fd] = NULL;
    }
    pthread_mutex_unlock(&mu);
    return close(fd);
}

static ssize_t total_len(const struct iovec *v, int n)
{
    ssize_t t = 0;
    for (int i = 0; i < n; i++)
        t += (ssize_t)v[i].iov_len;
    return t;
}

/* A write the layer fails (-1, errno set), shortens (*n cut) or lets through (0). */
static int write_fault(int fd, size_t *n)
{
    pthread_mutex_lock(&mu);
    Rule *r = match(IOF_WRITE, fd_path(fd));
    pthread_mutex_unlock(&mu);
    if (!r)
        return 0;
    if (r->short_write) { /* half (a multiple of 4 KiB where it can be: O_DIRECT descriptors), at least 1 */
        if (*n >= 8192)
            *n = (*n / 2) & ~(size_t)4095;
        else if (*n > 1)
            *n /= 2;
        return 0;
    }
    errno = r->err;
    return -1;
}

static void wrote(int fd, off_t off, ssize_t w)
{
    if (w <= 0)
        return;
    pthread_mutex_lock(&mu);
    note_write(fd_path(fd), (uint64_t)off, (uint64_t)off + (uint64_t)w);
    pthread_mutex_unlock(&mu);
}

ssize_t bks_io_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (!is_armed())
        return pwrite(fd, buf, n, off);
    if (write_fault(fd, &n) < 0)
        return -1;
    ssize_t w = pwrite(fd, buf, n, off);
    wrote(fd, off, w);
    return w;
}

ssize_t bks_io_pwritev(int fd, const struct iovec *v, int iovcnt, off_t off)
{
    if (!is_armed())
        return pwritev(fd, v, iovcnt, off);
    size_t n = (size_t)total_len(v, iovcnt), want = n;
    if (write_fault(fd, &n) < 0)
        return -1;
    ssize_t w;
    if (n < want) { /* a short write: the first n bytes */
        struct iovec cut[1024];
        int k = 0;
        size_t left = n;
        for (int i = 0; i < iovcnt && left && k < 1024; i++, k++) {
            cut[k] = v[i];
            if (cut[k].iov_len > left)
                cut[k].iov_len = left;
            left -= cut[k].iov_len;
        }
        w = pwritev(fd, cut, k, off);
    } else {
        w = pwritev(fd, v, iovcnt, off);
    }
    wrote(fd, off, w);
    return w;
}

ssize_t bks_io_pread(int fd, void *buf, size_t n, off_t off)
{
    int err = 0;
    if (is_armed()) {
        pthread_mutex_lock(&mu);
        Rule *r = match_at(IOF_READ, fd_path(fd), (long long)off, n);
        err = r ? r->err : 0;
        pthread_mutex_unlock(&mu);
    }
    if (err) {
        errno = err;
        return -1;
    }
    return pread(fd, buf, n, off);
}

/* A writeback or sync the layer fails: -1 with errno, after losing what `lose` says -- and
 * recording the error for the file's other descriptors (errseq); or one of those reporting an
 * error another descriptor's writeback met (mu taken). */
static int sync_fault(int op, int fd, uint64_t lo, uint64_t hi)
{
    pthread_mutex_lock(&mu);
    const char *path = fd_path(fd);
    Rule *r = match(op, path);
    int err = r ? r->err : 0;
    if (r && r->lose) {
        lose(path, lo, hi);
        Unsynced *u = unsynced_of(path, 1);
        if (u) {
            u->err_seq++;
            u->err = err;
            if (fd >= 0 && (size_t)fd < nfd_paths)
                fd_seen[fd] = u->err_seq; /* (reported here) */
        }
    } else if (!r) {
        err = unseen_error(fd, path);
    }
    pthread_mutex_unlock(&mu);
    if (!err)
        return 0;
    errno = err;
    return -1;
}

int bks_io_sync_file_range(int fd, off_t off, off_t n, unsigned int flags)
{
    if (is_armed() && sync_fault(IOF_SYNC_RANGE, fd, (uint64_t)off, n ? (uint64_t)off + (uint64_t)n : UINT64_MAX) < 0)
        return -1;
    return sync_file_range(fd, off, n, flags);
}

static int a_sync(int fd, int data_only)
{
    if (!is_armed())
        return data_only ? fdatasync(fd) : fsync(fd);
    if (sync_fault(IOF_SYNC, fd, 0, UINT64_MAX) < 0)
        return -1;
    /* what this sync covers: the bytes unsynced when it began */
    pthread_mutex_lock(&mu);
    char *path = strdup(fd_path(fd));
    Unsynced *u = path ? unsynced_of(path, 0) : NULL;
    size_t sn = u ? u->n : 0;
    uint64_t *slo = malloc((sn + 1) * sizeof *slo), *shi = malloc((sn + 1) * sizeof *shi);
    if (slo && shi && sn) {
        memcpy(slo, u->lo, sn * sizeof *slo);
        memcpy(shi, u->hi, sn * sizeof *shi);
    }
    pthread_mutex_unlock(&mu);
    int r = data_only ? fdatasync(fd) : fsync(fd);
    if (r == 0 && path && slo && shi) {
        pthread_mutex_lock(&mu);
        synced(path, slo, shi, sn);
        pthread_mutex_unlock(&mu);
    }
    free(slo);
    free(shi);
    free(path);
    return r;
}

int bks_io_fdatasync(int fd) { return a_sync(fd, 1); }
int bks_io_fsync(int fd) { return a_sync(fd, 0); }

int bks_io_rename(const char *from, const char *to)
{
    int err = is_armed() ? call_fault(IOF_RENAME, to, -1) : 0;
    if (err) {
        errno = err;
        return -1;
    }
    return rename(from, to);
}

int bks_io_fallocate(int fd, int mode, off_t off, off_t len)
{
    int err = is_armed() ? call_fault(IOF_FALLOCATE, NULL, fd) : 0;
    if (err) {
        errno = err;
        return -1;
    }
    return fallocate(fd, mode, off, len);
}

int bks_io_posix_fallocate(int fd, off_t off, off_t len)
{
    int err = is_armed() ? call_fault(IOF_FALLOCATE, NULL, fd) : 0;
    return err ? err : posix_fallocate(fd, off, len);
}

/* ---------------------------------------------------------------- control */
int bks_iof_op(const char *name)
{
    for (int i = 0; i < IOF_NOPS; i++)
        if (strcmp(name, op_names[i]) == 0)
            return i;
    return -1;
}

const char *bks_iof_op_name(int op) { return op >= 0 && op < IOF_NOPS ? op_names[op] : "?"; }

int bks_iof_add(int op, const char *path_contains, int err, long after, long times, int lose_, int short_write,
                long long at)
{
    if (op < 0 || op >= IOF_NOPS || strlen(path_contains) >= sizeof rules[0].path)
        return -1;
    pthread_mutex_lock(&mu);
    if (nrules == MAX_RULES) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    Rule *r = &rules[nrules++];
    memset(r, 0, sizeof *r);
    r->op = op;
    snprintf(r->path, sizeof r->path, "%s", path_contains);
    r->err = err;
    r->after = after;
    r->times = times;
    r->lose = lose_;
    r->short_write = short_write;
    r->at = op == IOF_READ ? at : -1;
    set_armed();
    pthread_mutex_unlock(&mu);
    return 0;
}

void bks_iof_clear(void)
{
    pthread_mutex_lock(&mu);
    nrules = 0;
    memset(fired, 0, sizeof fired);
    lost_bytes = 0;
    set_armed();
    pthread_mutex_unlock(&mu);
}

void bks_iof_track(int on)
{
    pthread_mutex_lock(&mu);
    tracking = on;
    if (!on)
        for (Unsynced *u = files; u; u = u->next)
            u->n = 0;
    set_armed();
    pthread_mutex_unlock(&mu);
}

void bks_iof_counts(long out[IOF_NOPS])
{
    pthread_mutex_lock(&mu);
    memcpy(out, fired, sizeof fired);
    pthread_mutex_unlock(&mu);
}

long bks_iof_lost_bytes(void)
{
    pthread_mutex_lock(&mu);
    long n = lost_bytes;
    pthread_mutex_unlock(&mu);
    return n;
}

void bks_iof_crash(void)
{
    pthread_mutex_lock(&mu); /* held to the end: no engine thread writes or syncs past this point */
    for (Unsynced *u = files; u; u = u->next)
        lose(u->path, 0, UINT64_MAX);
    raise(SIGKILL);
    for (;;)
        pause();
}
