/* A failing disk under one directory, for the tests (tests/diskfault/__init__.py).
 *
 * Loaded with LD_PRELOAD into a process, it passes every file call through, except the calls
 * on paths under CDC_FAULT_DIR while the control file CDC_FAULT_CTL names a fault:
 *
 *   off            nothing is injected
 *   eio-write      write, pwrite, writev, ftruncate fail with EIO (nothing written)
 *   eio-fsync      fsync and fdatasync fail with EIO (nothing synced)
 *   erofs          opening to write, writing, truncating, renaming, unlinking, making a
 *                  directory and syncing fail with EROFS (the file system turned read-only)
 *   enospc         writes and file creation fail with ENOSPC (cutting a file back works)
 *   slow-fsync MS  fsync and fdatasync take MS milliseconds more, then sync
 *
 * Any fault but slow-fsync may name a path prefix after it ("enospc /data/state/kafka"):
 * then only the paths under CDC_FAULT_DIR that start with it fail.
 *
 * The control file is mapped shared, so the test changes the fault at any instant by
 * rewriting it in place. With CDC_FAULT_LOG set, every fsync or fdatasync that succeeded
 * under the directory appends "sync PATH SIZE" to that file: what is durable, for a test
 * that checks no checkpoint gets ahead of it.
 *
 * The kernel's own ways (dm-flakey, dm-delay) need device-mapper, which these machines'
 * containers lack; a FUSE file system would do it too, at far more code.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CTL_SIZE 4096

enum fault { OFF, EIO_WRITE, EIO_FSYNC, EROFS_ALL, ENOSPC_WRITE, SLOW_FSYNC };

static const char *volatile ctl_map;
static char fault_dir[PATH_MAX];
static size_t fault_dir_len;
static int log_fd = -1;
static int initialised;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_mkdir)(const char *, mode_t);

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

__attribute__((constructor)) static void init(void) {
    RESOLVE(write); RESOLVE(pwrite); RESOLVE(pwrite64); RESOLVE(writev);
    RESOLVE(fsync); RESOLVE(fdatasync); RESOLVE(ftruncate); RESOLVE(ftruncate64);
    RESOLVE(open); RESOLVE(open64); RESOLVE(openat); RESOLVE(openat64);
    RESOLVE(rename); RESOLVE(renameat); RESOLVE(unlink); RESOLVE(unlinkat); RESOLVE(mkdir);
    const char *dir = getenv("CDC_FAULT_DIR");
    const char *ctl = getenv("CDC_FAULT_CTL");
    const char *log = getenv("CDC_FAULT_LOG");
    if (dir == NULL || ctl == NULL || realpath(dir, fault_dir) == NULL)
        return;
    fault_dir_len = strlen(fault_dir);
    int fd = real_open(ctl, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *map = mmap(NULL, CTL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return;
    if (log != NULL)
        log_fd = real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    ctl_map = map;
    initialised = 1;
}

/* The fault now; *millis its delay (slow-fsync), prefix (CTL_SIZE + 1 bytes) the paths it
 * is narrowed to ("" for every path under the directory). */
static enum fault read_fault(long *millis, char *prefix) {
    char text[CTL_SIZE + 1];
    memcpy(text, (const char *)ctl_map, CTL_SIZE);
    text[CTL_SIZE] = 0;
    char *end = text + strcspn(text, " \n");
    char *arg = *end == ' ' ? end + 1 : end;
    arg[strcspn(arg, " \n")] = 0;
    *end = 0;
    prefix[0] = 0;
    if (strcmp(text, "slow-fsync") == 0) {
        *millis = strtol(arg, NULL, 10);
        return SLOW_FSYNC;
    }
    strcpy(prefix, arg);
    if (strcmp(text, "eio-write") == 0) return EIO_WRITE;
    if (strcmp(text, "eio-fsync") == 0) return EIO_FSYNC;
    if (strcmp(text, "erofs") == 0) return EROFS_ALL;
    if (strcmp(text, "enospc") == 0) return ENOSPC_WRITE;
    return OFF;
}

static __thread char narrowed[CTL_SIZE + 1];  /* the prefix of the fault last read */

static enum fault current(long *millis) {
    if (!initialised || strncmp((const char *)ctl_map, "off", 3) == 0)
        return OFF;  /* (without copying the control file: most calls) */
    long ignored;
    return read_fault(millis != NULL ? millis : &ignored, narrowed);
}

static int in_dir(const char *path) {
    return strncmp(path, fault_dir, fault_dir_len) == 0 &&
           (path[fault_dir_len] == '/' || path[fault_dir_len] == 0);
}

/* Whether the fault read last applies to path. */
static int under_dir(const char *path) {
    return in_dir(path) && strncmp(path, narrowed, strlen(narrowed)) == 0;
}

static int fd_path(int fd, char *out) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    if (n < 0)
        return 0;
    out[n] = 0;
    return 1;
}

static int fd_under_dir(int fd) {
    char path[PATH_MAX];
    return fd_path(fd, path) && under_dir(path);
}

static int path_under_dir(int dirfd, const char *path) {
    char full[PATH_MAX];
    if (path[0] == '/')
        return under_dir(path);
    if (dirfd == AT_FDCWD) {
        if (getcwd(full, sizeof full) == NULL)
            return 0;
    } else if (!fd_path(dirfd, full)) {
        return 0;
    }
    size_t len = strlen(full);
    snprintf(full + len, sizeof full - len, "/%s", path);
    return under_dir(full);
}

/* The errno a write on fd fails with now (0: it goes through). */
static int write_fault(int fd) {
    enum fault f = current(NULL);
    int err = f == EIO_WRITE ? EIO : f == EROFS_ALL ? EROFS : f == ENOSPC_WRITE ? ENOSPC : 0;
    return err != 0 && fd_under_dir(fd) ? err : 0;
}

static void log_sync(int fd) {
    char path[PATH_MAX];
    struct stat st;
    if (log_fd < 0 || !fd_path(fd, path) || !in_dir(path) || fstat(fd, &st) != 0)
        return;
    char line[PATH_MAX + 64];
    int n = snprintf(line, sizeof line, "sync %s %lld\n", path, (long long)st.st_size);
    if (n > 0)
        real_write(log_fd, line, (size_t)n);
}

static int sync_with_faults(int fd, int (*real)(int)) {
    long millis = 0;
    enum fault f = current(&millis);
    if (f != OFF && fd_under_dir(fd)) {
        if (f == EIO_FSYNC) { errno = EIO; return -1; }
        if (f == EROFS_ALL) { errno = EROFS; return -1; }
        if (f == SLOW_FSYNC && millis > 0) {
            struct timespec pause = {millis / 1000, (millis % 1000) * 1000000L};
            while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
        }
    }
    int rc = real(fd);
    if (rc == 0)
        log_sync(fd);
    return rc;
}

#define FAIL_WRITE(fd) do { int e_ = write_fault(fd); if (e_) { errno = e_; return -1; } } while (0)

ssize_t write(int fd, const void *buf, size_t n) { FAIL_WRITE(fd); return real_write(fd, buf, n); }
ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) { FAIL_WRITE(fd); return real_pwrite(fd, buf, n, at); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) { FAIL_WRITE(fd); return real_pwrite64(fd, buf, n, at); }
ssize_t writev(int fd, const struct iovec *iov, int count) { FAIL_WRITE(fd); return real_writev(fd, iov, count); }
/* A full disk still lets a file be cut back (the store undoes a transaction so). */
static int truncate_fault(int fd) {
    int err = write_fault(fd);
    return err == ENOSPC ? 0 : err;
}

#define FAIL_TRUNCATE(fd) do { int e_ = truncate_fault(fd); if (e_) { errno = e_; return -1; } } while (0)

int ftruncate(int fd, off_t size) { FAIL_TRUNCATE(fd); return real_ftruncate(fd, size); }
int ftruncate64(int fd, off_t size) { FAIL_TRUNCATE(fd); return real_ftruncate64(fd, size); }
int fsync(int fd) { return sync_with_faults(fd, real_fsync); }
int fdatasync(int fd) { return sync_with_faults(fd, real_fdatasync); }

/* The errno opening path with flags fails with now (0: it goes through). */
static int open_fault(int dirfd, const char *path, int flags) {
    enum fault f = current(NULL);
    if (f != EROFS_ALL && f != ENOSPC_WRITE)
        return 0;
    int writes = (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0;
    if (!writes || !path_under_dir(dirfd, path))
        return 0;
    if (f == ENOSPC_WRITE && (flags & O_CREAT) == 0)
        return 0;
    return f == EROFS_ALL ? EROFS : ENOSPC;
}

#define OPEN_BODY(real, dirfd, ...)                                       \
    mode_t mode = 0;                                                      \
    if (flags & (O_CREAT | O_TMPFILE)) {                                  \
        va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
    }                                                                     \
    int e_ = open_fault(dirfd, path, flags);                              \
    if (e_) { errno = e_; return -1; }                                    \
    return real(__VA_ARGS__, flags, mode)

int open(const char *path, int flags, ...) { OPEN_BODY(real_open, AT_FDCWD, path); }
int open64(const char *path, int flags, ...) { OPEN_BODY(real_open64, AT_FDCWD, path); }
int openat(int dirfd, const char *path, int flags, ...) { OPEN_BODY(real_openat, dirfd, dirfd, path); }
int openat64(int dirfd, const char *path, int flags, ...) { OPEN_BODY(real_openat64, dirfd, dirfd, path); }

static int namespace_fault(int dirfd, const char *path) {
    return current(NULL) == EROFS_ALL && path_under_dir(dirfd, path) ? EROFS : 0;
}

#define FAIL_NAMES(dirfd, path) do { int e_ = namespace_fault(dirfd, path); if (e_) { errno = e_; return -1; } } while (0)

int rename(const char *from, const char *to) { FAIL_NAMES(AT_FDCWD, to); return real_rename(from, to); }
int renameat(int fromfd, const char *from, int tofd, const char *to) { FAIL_NAMES(tofd, to); return real_renameat(fromfd, from, tofd, to); }
int unlink(const char *path) { FAIL_NAMES(AT_FDCWD, path); return real_unlink(path); }
int unlinkat(int dirfd, const char *path, int flags) { FAIL_NAMES(dirfd, path); return real_unlinkat(dirfd, path, flags); }
int mkdir(const char *path, mode_t mode) { FAIL_NAMES(AT_FDCWD, path); return real_mkdir(path, mode); }
