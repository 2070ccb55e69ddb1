import Foundation
import LinuxSystem
#if canImport(Glibc)
import Glibc
#endif

/// A program a test starts, watched with `waitpid` instead of Foundation's `Process`.
///
/// Why not `Process`: on Linux it learns of a child's exit when a socket the child inherits
/// closes. A child spawned at the same moment by another test can inherit that socket too
/// (it is not close-on-exec), and then the first child's exit goes unnoticed for as long as
/// the second one lives: `waitUntilExit()` then spins forever on a thread of the cooperative
/// pool (two on this machine), and the whole suite stalls. Here the exit is asked of the
/// kernel, every descriptor above standard error is closed in the child, and waiting is a
/// polling loop that never holds a thread.
public final class ChildProcess: Sendable {
    /// The child's process ID (reaped, so meaningless, once ``status`` is known).
    public let pid: pid_t
    private let reaped = Locked<Int32?>(nil)
    /// A description for error messages.
    public let command: String

    /// Starts `executable` with `arguments`; standard input read from `stdin`, standard output
    /// and error appended to `stdout` and `stderr` (created if missing; the same path twice
    /// shares one file). Signals the test runner ignores or blocks are restored to their
    /// defaults in the child, so it can be interrupted as from a shell.
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        stdin: String = "/dev/null", stdout: String = "/dev/null", stderr: String = "/dev/null"
    ) throws {
        command = ([executable] + arguments).joined(separator: " ")
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        if stderr == stdout {
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
        } else {
            posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        }
        closeInheritedDescriptors(&actions)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let environment = environment ?? ProcessInfo.processInfo.environment
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var child: pid_t = 0
        let result = posix_spawn(&child, executable, &actions, &attributes, argv, envp)
        guard result == 0 else {
            throw SpawnError(command: command, reason: String(cString: strerror(result)))
        }
        pid = child
    }

    /// The exit status, or the number of the signal that ended it (as `Process` reports);
    /// nil while it runs.
    public var status: Int32? {
        reaped.withLock { status in
            if let status { return status }
            var raw: Int32 = 0
            var result: pid_t
            repeat { result = waitpid(pid, &raw, WNOHANG) } while result == -1 && errno == EINTR
            guard result == pid else { return nil }
            let signal = raw & 0x7f
            status = signal == 0 ? (raw >> 8) & 0xff : signal
            return status
        }
    }

    public var isRunning: Bool { status == nil }

    /// Sends `signal` unless the child has already been reaped (its ID may be reused).
    public func send(_ signal: Int32) {
        reaped.withLock { status in
            if status == nil { _ = Glibc.kill(pid, signal) }
        }
    }

    /// Waits until the child exits or `timeout` passes; true if it exited.
    public func wait(timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while isRunning {
            guard ContinuousClock.now < deadline else { return false }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return true
    }

    /// ``wait(timeout:)`` for synchronous callers: sleeps its own thread.
    public func waitBlocking(timeout: Duration) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while isRunning {
            guard ContinuousClock.now < deadline else { return false }
            usleep(10_000)
        }
        return true
    }

    /// Asks the child to end (SIGTERM, so a script's cleanup runs), then SIGKILL after `grace`.
    public func stop(grace: Duration = .seconds(2)) async {
        send(SIGTERM)
        if await !wait(timeout: grace) { kill() }
    }

    /// Ends the child with SIGKILL and reaps it.
    public func kill() {
        send(SIGKILL)
        // A killed process is gone within milliseconds; the bound only guards the test run.
        _ = waitBlocking(timeout: .seconds(10))
    }

    deinit { if isRunning { kill() } }
}

/// Adds to `actions` the closing of every descriptor above standard error, so a child holds
/// none of the test runner's sockets or files: glibc's `posix_spawn_file_actions_addclosefrom_np`
/// (2.34; not in Swift's Glibc module, hence looked up), else one close per descriptor open now.
private func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") {
        _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
        return
    }
    let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    for descriptor in open.compactMap({ Int32($0) }) where descriptor > 2 {
        posix_spawn_file_actions_addclose(&actions, descriptor)
    }
}

/// A program that could not be started.
public struct SpawnError: Error, CustomStringConvertible {
    public let command: String
    public let reason: String
    public var description: String { "could not start \(command): \(reason)" }
}

/// A program run to its end (or killed at its time limit), with what it printed.
public struct Subprocess: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
    public var timedOut: Bool

    /// The full path of `tool` on PATH, or nil.
    public static func which(_ tool: String) -> String? {
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(directory)/\(tool)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    /// Runs `executable` to its end, stopped after `timeout`; output goes through temporary
    /// files (a pipe's end could be inherited by another test's child and never reach EOF).
    public static func run(
        _ executable: String, _ arguments: [String], stdin: Data? = nil, environment: [String: String]? = nil,
        timeout: Duration = .seconds(20)
    ) async throws -> Subprocess {
        let files = try OutputFiles(stdin: stdin)
        defer { files.remove() }
        let child = try ChildProcess(executable, arguments, environment: environment,
                                     stdin: files.input, stdout: files.output, stderr: files.errors)
        let exited = await child.wait(timeout: timeout)
        if !exited { await child.stop() }
        return files.result(status: child.status ?? -1, timedOut: !exited)
    }

    /// ``run(_:_:stdin:environment:timeout:)`` for synchronous callers.
    public static func runBlocking(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, timeout: Duration = .seconds(60)
    ) throws -> Subprocess {
        let files = try OutputFiles(stdin: nil)
        defer { files.remove() }
        let child = try ChildProcess(executable, arguments, environment: environment,
                                     stdin: files.input, stdout: files.output, stderr: files.errors)
        let exited = child.waitBlocking(timeout: timeout)
        if !exited { child.kill() }
        return files.result(status: child.status ?? -1, timedOut: !exited)
    }
}

/// A private folder for one run's input and output.
private struct OutputFiles {
    let folder: String
    var input: String { folder + "/in" }
    var output: String { folder + "/out" }
    var errors: String { folder + "/err" }

    init(stdin: Data?) throws {
        var template = Array((NSTemporaryDirectory() + "/qxfer-run-XXXXXX").utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw SpawnError(command: "mkdtemp", reason: String(cString: strerror(errno)))
        }
        folder = String(cString: made)
        guard FileManager.default.createFile(atPath: folder + "/in", contents: stdin ?? Data()) else {
            throw SpawnError(command: "create \(folder)/in", reason: "failed")
        }
    }

    func result(status: Int32, timedOut: Bool) -> Subprocess {
        Subprocess(status: status,
                   stdout: (try? String(contentsOfFile: output, encoding: .utf8)) ?? "",
                   stderr: (try? String(contentsOfFile: errors, encoding: .utf8)) ?? "",
                   timedOut: timedOut)
    }

    func remove() { try? FileManager.default.removeItem(atPath: folder) }
}
