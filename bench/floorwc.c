/* The C write floor: bench/floorwfs.py's passthrough on libfuse's own request loop.
 *
 *   cc -O2 -o floorwc bench/floorwc.c $(pkg-config --cflags --libs fuse3)
 *   ./floorwc SRC MOUNTPOINT      (prints READY once mounted; SIGTERM unmounts)
 *
 * The same kernel-facing choices as casfs's view and the Python floor (writeback
 * cache, default_permissions, nodev, hour-long entry/attr timeouts and 1 s on the
 * root, misses answered as cached negative entries, FLUSH answered ENOSYS,
 * write-only opens given a read-write fd), on libfuse's single-threaded
 * low-level loop: no Python, no trio. Inodes hold an O_PATH fd (as libfuse's
 * passthrough_ll example); a put uses no hard links, so names are not merged into
 * one inode. What a put costs it is the kernel's FUSE round trips and the upper's
 * syscalls: the floor of any FUSE filesystem here, for the issue 13 write row.
 * Built and run by bench.abfuse (``--c-floor``) where cc and fuse3 headers exist.
 */
#define FUSE_USE_VERSION 35
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define HOUR 3600.0

struct ino { int fd; uint64_t nlookup; };
static struct ino root;

static struct ino *I(fuse_ino_t n) { return n == FUSE_ROOT_ID ? &root : (struct ino *)(uintptr_t)n; }
static double tmo(fuse_ino_t n) { return n == FUSE_ROOT_ID ? 1.0 : HOUR; }

static void procname(int fd, char *buf) { sprintf(buf, "/proc/self/fd/%d", fd); }

/* an entry reply for parent/name (counts one lookup); a miss is a cached negative */
static int do_lookup(fuse_ino_t parent, const char *name, struct fuse_entry_param *e) {
    memset(e, 0, sizeof *e);
    e->attr_timeout = e->entry_timeout = HOUR;
    int fd = openat(I(parent)->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno;
    if (fstatat(fd, "", &e->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
        int err = errno; close(fd); return err;
    }
    struct ino *i = calloc(1, sizeof *i);
    i->fd = fd; i->nlookup = 1;
    e->ino = (uintptr_t)i;
    return 0;
}

static void op_init(void *ud, struct fuse_conn_info *conn) {
    (void)ud;
    if (conn->capable & FUSE_CAP_WRITEBACK_CACHE) conn->want |= FUSE_CAP_WRITEBACK_CACHE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e;
    int err = do_lookup(parent, name, &e);
    if (err == ENOENT) { e.ino = 0; e.entry_timeout = HOUR; fuse_reply_entry(req, &e); }
    else if (err) fuse_reply_err(req, err);
    else fuse_reply_entry(req, &e);
}

static void forget_one(fuse_ino_t n, uint64_t k) {
    struct ino *i = I(n);
    if (i == &root) return;
    if ((i->nlookup -= k) == 0) { close(i->fd); free(i); }
}

static void op_forget(fuse_req_t req, fuse_ino_t n, uint64_t k) { forget_one(n, k); fuse_reply_none(req); }

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f) {
    for (size_t j = 0; j < count; j++) forget_one(f[j].ino, f[j].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    (void)fi;
    struct stat st;
    if (fstatat(I(n)->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) fuse_reply_err(req, errno);
    else fuse_reply_attr(req, &st, tmo(n));
}

static void op_setattr(fuse_req_t req, fuse_ino_t n, struct stat *a, int to_set, struct fuse_file_info *fi) {
    char p[64];
    int fd = I(n)->fd, r = 0;
    procname(fd, p);
    if (to_set & FUSE_SET_ATTR_MODE) r = fi ? fchmod(fi->fh, a->st_mode) : chmod(p, a->st_mode);
    if (!r && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
        uid_t u = (to_set & FUSE_SET_ATTR_UID) ? a->st_uid : (uid_t)-1;
        gid_t g = (to_set & FUSE_SET_ATTR_GID) ? a->st_gid : (gid_t)-1;
        r = fchownat(fd, "", u, g, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
    }
    if (!r && (to_set & FUSE_SET_ATTR_SIZE)) r = fi ? ftruncate(fi->fh, a->st_size) : truncate(p, a->st_size);
    if (!r && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
        struct timespec tv[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
        if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = a->st_atim;
        if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = a->st_mtim;
        r = fi ? futimens(fi->fh, tv) : utimensat(AT_FDCWD, p, tv, 0);
    }
    if (r < 0) { fuse_reply_err(req, errno); return; }
    op_getattr(req, n, fi);
}

static void reply_new(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e;
    int err = do_lookup(parent, name, &e);
    if (err) fuse_reply_err(req, err); else fuse_reply_entry(req, &e);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
    if (mkdirat(I(parent)->fd, name, mode) < 0) fuse_reply_err(req, errno);
    else reply_new(req, parent, name);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
    fuse_reply_err(req, unlinkat(I(parent)->fd, name, 0) < 0 ? errno : 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
    fuse_reply_err(req, unlinkat(I(parent)->fd, name, AT_REMOVEDIR) < 0 ? errno : 0);
}

static void op_rename(fuse_req_t req, fuse_ino_t p, const char *name, fuse_ino_t np,
                      const char *newname, unsigned int flags) {
    if (flags) { fuse_reply_err(req, EINVAL); return; }
    fuse_reply_err(req, renameat(I(p)->fd, name, I(np)->fd, newname) < 0 ? errno : 0);
}

static int wflags(int flags) {
    /* the writeback cache may read back pages it writes partially */
    if ((flags & O_ACCMODE) == O_WRONLY) flags = (flags & ~O_ACCMODE) | O_RDWR;
    return (flags & ~(O_APPEND | O_NOCTTY)) | O_CLOEXEC;
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) {
    int fd = openat(I(parent)->fd, name, wflags(fi->flags) | O_CREAT | O_EXCL, mode);
    if (fd < 0) { fuse_reply_err(req, errno); return; }
    struct fuse_entry_param e;
    int err = do_lookup(parent, name, &e);
    if (err) { close(fd); fuse_reply_err(req, err); return; }
    fi->fh = fd;
    fuse_reply_create(req, &e, fi);
}

static void op_open(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    char p[64];
    procname(I(n)->fd, p);
    int fd = open(p, wflags(fi->flags) & ~(O_CREAT | O_EXCL | O_NOFOLLOW));
    if (fd < 0) { fuse_reply_err(req, errno); return; }
    fi->fh = fd;
    fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t n, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)n;
    char *buf = malloc(size);
    ssize_t r = pread(fi->fh, buf, size, off);
    if (r < 0) fuse_reply_err(req, errno); else fuse_reply_buf(req, buf, r);
    free(buf);
}

static void op_write(fuse_req_t req, fuse_ino_t n, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    (void)n;
    ssize_t r = pwrite(fi->fh, buf, size, off);
    if (r < 0) fuse_reply_err(req, errno); else fuse_reply_write(req, r);
}

static void op_flush(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    (void)n; (void)fi;
    fuse_reply_err(req, ENOSYS); /* the kernel stops sending FLUSH */
}

static void op_release(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    (void)n;
    close(fi->fh);
    fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    int fd = openat(I(n)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) { fuse_reply_err(req, errno); return; }
    fi->fh = (uintptr_t)d;
    fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t n, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)n;
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    char *buf = calloc(1, size);
    size_t used = 0;
    seekdir(d, off);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st = {.st_ino = de->d_ino, .st_mode = (mode_t)de->d_type << 12};
        size_t len = fuse_add_direntry(req, buf + used, size - used, de->d_name, &st, telldir(d));
        if (len > size - used) break;
        used += len;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t n, struct fuse_file_info *fi) {
    (void)n;
    closedir((DIR *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t n) {
    struct statvfs s;
    if (fstatvfs(root.fd, &s) < 0) fuse_reply_err(req, errno); else fuse_reply_statfs(req, &s);
    (void)n;
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init, .lookup = op_lookup, .forget = op_forget, .forget_multi = op_forget_multi,
    .getattr = op_getattr, .setattr = op_setattr, .mkdir = op_mkdir, .unlink = op_unlink,
    .rmdir = op_rmdir, .rename = op_rename, .create = op_create, .open = op_open,
    .read = op_read, .write = op_write, .flush = op_flush, .release = op_release,
    .opendir = op_opendir, .readdir = op_readdir, .releasedir = op_releasedir,
    .statfs = op_statfs,
};

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: floorwc SRC MOUNTPOINT\n"); return 2; }
    umask(0); /* modes exactly as asked (the kernel applied the caller's umask) */
    root.fd = open(argv[1], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root.fd < 0) { perror(argv[1]); return 1; }
    root.nlookup = 2;
    char *fargv[] = {argv[0], "-o", "default_permissions,nodev,fsname=casfs-floorwc,subtype=casfs", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[2]) != 0) return 1;
    printf("READY\n");
    fflush(stdout);
    int rc = fuse_session_loop(se); /* one thread, as pyfuse3 with max_tasks=1 */
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return rc ? 1 : 0;
}
