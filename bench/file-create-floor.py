#!/usr/bin/env python3
"""The file system's floor for receiving many small files (issue 21): how long this machine
takes just to create N files of SIZE bytes the crash-safe way, in one thread, with no network,
no hashing and no sync, two ways:

  partial  what qxfer's receiver does per file: look the name up, create a partial with
           O_CREAT|O_EXCL, write, fchmod, futimens, rename to the final name, close
  tmpfile  the cheapest crash-safe alternative: an unnamed O_TMPFILE inode, write, fchmod,
           futimens, linkat to the final name (no partial name to add and remove)

Each run writes into a new folder under DIR (default: a new folder beside this script's
working directory) and deletes nothing: on ext4, creating files right after deleting many is
far slower (bench/small-files.sh says why). Prints wall and CPU seconds per mode.

    bench/file-create-floor.py [--files 10000] [--size 4096] [--runs 2] [--dir PATH]
"""
import argparse
import os
import time


def run(mode: str, folder: str, files: int, data: bytes) -> tuple[float, float, float]:
    os.makedirs(folder)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    start, cpu = time.perf_counter(), os.times()
    for i in range(files):
        name = "f%06d.bin" % i
        if mode == "partial":
            try:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            partial = "." + name + ".qxfer-partial"
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            os.pwrite(fd, data, 0)
            os.fchmod(fd, 0o644)
            os.utime(fd, (1, 1))
            os.rename(partial, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            fd = os.open(".", os.O_RDWR | os.O_TMPFILE, 0o600, dir_fd=dfd)
            os.pwrite(fd, data, 0)
            os.fchmod(fd, 0o644)
            os.utime(fd, (1, 1))
            os.link("/proc/self/fd/%d" % fd, name, dst_dir_fd=dfd, follow_symlinks=True)
        os.close(fd)
    wall, end = time.perf_counter() - start, os.times()
    os.close(dfd)
    return wall, end.user - cpu.user, end.system - cpu.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default=os.path.abspath("file-create-floor.%d" % os.getpid()))
    args = parser.parse_args()
    data = os.urandom(args.size)
    os.makedirs(args.dir, exist_ok=True)
    for r in range(args.runs):
        for mode in ("partial", "tmpfile"):
            wall, user, system = run(mode, os.path.join(args.dir, "%s-%d" % (mode, r)), args.files, data)
            print("%-8s %d files of %d bytes: wall %.3f s, user %.3f s, system %.3f s (%.1f us a file)"
                  % (mode, args.files, args.size, wall, user, system, wall / args.files * 1e6))
    print("left in %s (deleting many files slows the next creations on ext4: remove it later)" % args.dir)


if __name__ == "__main__":
    main()
