import Glibc

/// Waiting for a descriptor to have something to read, in a way task cancellation reaches.
/// A blocking `read` on an idle pipe (`sleep 30 | qxfer send -`) holds its thread until data
/// or the end comes, whatever is cancelled meanwhile: Ctrl-C went unheard for as long.
public enum ReadableWait {
    /// Returns once `fd` has data, its end or an error to report (a `read` then does not
    /// block), or throws `CancellationError` as soon as the task is cancelled. The wait, if
    /// any, is a `poll` on a thread of its own, woken through a pipe by the cancellation.
    public static func untilReadable(_ fd: Int32) async throws {
        try Task.checkCancellation()
        if isReadable(fd, timeoutMilliseconds: 0) { return }
        var ends: [Int32] = [-1, -1]
        // Without a pipe (descriptors exhausted) the read blocks as it always could.
        guard pipe(&ends) == 0 else { return }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }  // a child spawned meanwhile inherits neither
        let (wake, waker) = (ends[0], Locked<Int32?>(ends[1]))
        // The pipe is written by the cancellation handler, which may run at any moment, even
        // after the wait ended: the lock keeps it from writing to a closed (or reused) number.
        await withTaskCancellationHandler {
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                DetachedThread.run {
                    var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0), pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
                    while poll(&fds, 2, -1) < 0 && errno == EINTR {}
                    done.resume()
                }
            }
        } onCancel: {
            waker.withLock { wake in
                guard let wake else { return }
                var one: UInt8 = 1
                _ = write(wake, &one, 1)
            }
        }
        waker.withLock { end in
            if let open = end { close(open) }
            end = nil
        }
        close(wake)
        try Task.checkCancellation()
    }

    /// Whether `fd` is ready to read (data, end of file, hang-up or error) within the timeout.
    private static func isReadable(_ fd: Int32, timeoutMilliseconds: Int32) -> Bool {
        var request = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        var result: Int32
        repeat { result = poll(&request, 1, timeoutMilliseconds) } while result < 0 && errno == EINTR
        // poll failing (an invalid descriptor) is the read's to report.
        return result != 0
    }
}
