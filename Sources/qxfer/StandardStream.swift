import Glibc

/// Standard output or standard error, written with write(2): whole, unbuffered (a pipe sees
/// each line at once), retried when interrupted; a closed reader or a full disk loses the text
/// quietly, as a report cannot be reported anywhere else.
enum StandardStream: Int32 {
    case output = 1
    case error = 2

    /// Whether the stream is a terminal.
    var isTerminal: Bool { isatty(rawValue) == 1 }

    func write(_ text: String) {
        var text = text
        text.withUTF8 { bytes in
            guard let base = bytes.baseAddress else { return }
            var done = 0
            while done < bytes.count {
                let n = Glibc.write(rawValue, base + done, bytes.count - done)
                if n > 0 {
                    done += n
                } else if n < 0 && errno == EINTR {
                    continue
                } else if n < 0 && errno == EAGAIN {
                    var request = pollfd(fd: rawValue, events: Int16(POLLOUT), revents: 0)
                    _ = poll(&request, 1, -1)
                } else {
                    return
                }
            }
        }
    }
}
