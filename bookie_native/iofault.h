/* bkspark bookie storage engine: the system calls every engine file makes for its own files, through a
 * test-only fault layer (iofault.c), in the spirit of LevelDB's Env and RocksDB's FaultInjectionTestFS.
 *
 * engine_int.h includes this header last, so `open(...)`, `pwrite(...)`, `fdatasync(...)` and the
 * others below written in an engine file call the bks_io_* wrappers.  Unarmed (no fault rule and no
 * tracking: always outside tests) a wrapper costs one relaxed load before the real call; open and close
 * also remember which path each descriptor names.  Armed, from Python (`bkspark._native.io_*`):
 *
 *   - a rule fails matching calls (op, a substring of the file's path): with an errno (EIO, ENOSPC...),
 *     after `after` matching calls, `times` times (-1: until cleared); a write rule may instead write
 *     only part of the bytes (a short write, which is not an error);
 *   - a failed writeback (sync_file_range, fdatasync, fsync) with `lose` set loses the file's unsynced
 *     bytes in that range, as Linux does: the pages are marked clean, the error is reported once to
 *     each descriptor open on the file (errseq: the next sync of every other one fails too, then
 *     succeeds), and the disk keeps what it had -- the layer writes zeros over them (so reads see
 *     the loss too) and forgets them.  `lose` needs tracking on (bks_iof_track) from before the
 *     writes;
 *   - with tracking on, bks_iof_crash() drops every byte written since its file's last successful
 *     fdatasync/fsync (zeros again) and SIGKILLs the process: a power loss, not just a kill -9
 *     (which keeps the page cache).  Limits: a rename or a file creation is durable when it returns
 *     (the directory's fsync is not modelled); RocksDB (the index) does its own I/O, outside the layer.
 */
#ifndef BKS_IOFAULT_H
#define BKS_IOFAULT_H
#include <sys/types.h>
#include <sys/uio.h>

enum { IOF_OPEN, IOF_WRITE, IOF_SYNC_RANGE, IOF_SYNC, IOF_RENAME, IOF_FALLOCATE, IOF_READ, IOF_NOPS };

int bks_io_open(const char *path, int flags, ...);
int bks_io_close(int fd);
ssize_t bks_io_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t bks_io_pwritev(int fd, const struct iovec *v, int iovcnt, off_t off);
ssize_t bks_io_pread(int fd, void *buf, size_t n, off_t off);
int bks_io_sync_file_range(int fd, off_t off, off_t n, unsigned int flags);
int bks_io_fdatasync(int fd);
int bks_io_fsync(int fd);
int bks_io_rename(const char *from, const char *to);
int bks_io_fallocate(int fd, int mode, off_t off, off_t len);
int bks_io_posix_fallocate(int fd, off_t off, off_t len);

/* control (the binding's test hooks) */
int bks_iof_op(const char *name); /* IOF_* of "open", "write", "sync_range", "sync", "rename",
                                   * "fallocate", "read"; -1: unknown */
const char *bks_iof_op_name(int op);
int bks_iof_add(int op, const char *path_contains, int err, long after, long times, int lose, int short_write,
                long long at); /* at >= 0 (reads): only a read including that byte, as a bad block */
void bks_iof_clear(void);     /* remove every rule (tracking stays as set) */
void bks_iof_track(int on);   /* track unsynced bytes (for lose and crash) */
void bks_iof_counts(long out[IOF_NOPS]); /* faults fired per op since the last clear */
long bks_iof_lost_bytes(void);           /* bytes zeroed by lose or a crash since the last clear */
void bks_iof_crash(void);     /* drop unsynced bytes, then SIGKILL (never returns) */

#ifndef BKS_IOFAULT_IMPL
#define open(...) bks_io_open(__VA_ARGS__)
#define close(fd) bks_io_close(fd)
#define pwrite(...) bks_io_pwrite(__VA_ARGS__)
#define pwritev(...) bks_io_pwritev(__VA_ARGS__)
#define pread(...) bks_io_pread(__VA_ARGS__)
#define sync_file_range(...) bks_io_sync_file_range(__VA_ARGS__)
#define fdatasync(fd) bks_io_fdatasync(fd)
#define fsync(fd) bks_io_fsync(fd)
#define rename(a, b) bks_io_rename(a, b)
#define fallocate(...) bks_io_fallocate(__VA_ARGS__)
#define posix_fallocate(...) bks_io_posix_fallocate(__VA_ARGS__)
#endif

#endif
