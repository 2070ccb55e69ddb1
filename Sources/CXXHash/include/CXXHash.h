// XXH3 from Debian's libxxhash (the library, not the header-only inline build), plus the one
// Linux call qxfer's file store needs that Swift's Glibc module does not show.
#ifndef CXXHASH_H
#define CXXHASH_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <xxhash.h>
#include <stdio.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

/// renameat2(2); flags 1 is RENAME_NOREPLACE. Returns 0 or -1 with errno set.
static inline int cxxhash_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}
#endif
