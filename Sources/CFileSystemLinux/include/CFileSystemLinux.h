// Linux file-system calls Swift's Glibc module does not show (statfs; renameat2 is variadic syscall(2)
// underneath, which Swift cannot call; syncfs, sync_file_range and O_PATH are declared only under
// _GNU_SOURCE): used only through SafeOutput's Swift wrappers.
#ifndef CFILESYSTEMLINUX_H
#define CFILESYSTEMLINUX_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/vfs.h>

/// renameat2(2); flags 1 is RENAME_NOREPLACE. Returns 0 or -1 with errno set.
static inline int cfslinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

/// syncfs(2): writes back and flushes the whole file system holding fd. Returns 0 or -1 with errno set.
static inline int cfslinux_syncfs(int fd) {
    return syncfs(fd);
}

/// sync_file_range(2) with SYNC_FILE_RANGE_WRITE: starts writing back the dirty pages of a range
/// without waiting for them. Returns 0 or -1 with errno set.
static inline int cfslinux_start_write_back(int fd, long long offset, long long length) {
    return sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE);
}

/// openat(2) of the folder `name` in `dirfd` as a handle only (O_PATH): no read permission
/// needed, never through a symlink. Returns the descriptor or -1 with errno set.
static inline int cfslinux_open_directory_handle(int dirfd, const char *name) {
    return openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/// statfs(2)'s f_type: the type of the file system holding `path` (a magic number of
/// <linux/magic.h>). Returns 0 and sets *type, or -1 with errno set.
static inline int cfslinux_file_system_type(const char *path, long long *type) {
    struct statfs info;
    if (statfs(path, &info) != 0) return -1;
    *type = (long long)info.f_type;
    return 0;
}
#endif
