// What a path names, for a program about to write to it. The one rule of this module: a
// temporary file renamed over the target is right for a regular file and wrong for everything
// else — renamed over /dev/null it replaces the device, over a FIFO it replaces the pipe its
// reader waits on, over a symlink it replaces the link instead of the file it points to.
import Glibc

/// What a path names, following symlinks (the kind of the file a write would reach).
public enum OutputKind: Equatable, Sendable, CustomStringConvertible {
    /// Nothing exists at the path (a dangling symlink counts as absent: the file it names does not exist).
    case absent
    /// A regular file: written through a temporary file and renamed into place.
    case regularFile
    /// A character device: a terminal, /dev/null, a serial line. Written directly.
    case characterDevice
    /// A named pipe (FIFO). Written directly, so the reader sees the bytes as they come.
    case fifo
    /// A Unix-domain socket. Written after connecting to it.
    case socket
    /// A folder: never an output.
    case directory
    /// A block device: never an output (it would overwrite a disk).
    case blockDevice

    /// Classifies `path` with stat(2), which follows symlinks.
    ///
    /// - Throws: ``OutputError`` when the path cannot be examined (a missing folder on the way
    ///   is reported as ``absent``; permission problems are errors).
    public init(path: String) throws(OutputError) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            let err = errno
            if err == ENOENT { self = .absent; return }
            throw OutputError("cannot examine \(path)", errno: err)
        }
        self.init(mode: info.st_mode)
    }

    init(mode: mode_t) {
        switch mode & S_IFMT {
        case S_IFREG: self = .regularFile
        case S_IFCHR: self = .characterDevice
        case S_IFIFO: self = .fifo
        case S_IFSOCK: self = .socket
        case S_IFDIR: self = .directory
        default: self = .blockDevice
        }
    }

    /// Whether writes go straight to the object (devices, pipes, sockets) rather than through
    /// a temporary file renamed into place.
    public var isWrittenDirectly: Bool {
        switch self {
        case .characterDevice, .fifo, .socket: true
        case .absent, .regularFile, .directory, .blockDevice: false
        }
    }

    public var description: String {
        switch self {
        case .absent: "nothing"
        case .regularFile: "a regular file"
        case .characterDevice: "a character device"
        case .fifo: "a named pipe"
        case .socket: "a socket"
        case .directory: "a folder"
        case .blockDevice: "a block device"
        }
    }
}

/// A failure to write an output: one line for a person, and the errno behind it if any.
public struct OutputError: Error, Sendable, CustomStringConvertible {
    /// One line for a person, including the system's reason when there is one.
    public let message: String
    /// The errno that caused it, if a system call failed.
    public let errno: Int32?

    public init(_ message: String, errno: Int32? = nil) {
        if let errno {
            self.message = message + ": " + String(cString: strerror(errno))
        } else {
            self.message = message
        }
        self.errno = errno
    }

    public var description: String { message }
}
