import Foundation
import Glibc
import Testing
@testable import SafeOutput

/// Every kind of path an output can be pointed at: what is written where, and what is left at
/// the path afterwards. Devices are private nodes made with mknod in a temporary folder.
/// glibc's makedev for small numbers (a macro Swift does not import).
func makedev(_ major: UInt64, _ minor: UInt64) -> dev_t { dev_t((major << 8) | minor) }

@Suite struct OutputFileTests {
    let folder: String

    init() throws {
        var template = Array("/tmp/qxfer-output-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw OutputError("mkdtemp", errno: errno) }
        folder = String(cString: made)
    }

    func kind(_ path: String) -> mode_t {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_mode & S_IFMT : 0
    }

    func contents(_ path: String) -> [UInt8]? { FileManager.default.contents(atPath: path).map(Array.init) }

    func leftovers() -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: folder).filter { $0.contains(".qxfer-tmp-") }) ?? []
    }

    @Test func aRegularFileKeepsItsOldContentUntilFinished() throws {
        let path = folder + "/out.ivf"
        try Data("old".utf8).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o640)
        let output = try OutputFile(path: path)
        #expect(output.kind == .regularFile && output.isSeekable)
        try output.write(Array("new bytes".utf8))
        #expect(try output.patch(Array("N".utf8), at: 0))
        #expect(contents(path) == Array("old".utf8))  // still the old file while writing
        try output.finish()
        #expect(contents(path) == Array("New bytes".utf8))
        var info = stat()
        stat(path, &info)
        #expect(info.st_mode & 0o777 == 0o640)  // the replaced file's mode carries over
        #expect(leftovers().isEmpty)
    }

    /// A cache's replacement skips the syncs but not the atomic rename: the path goes from the
    /// whole old file to the whole new one, with the mode asked for and no temporary left.
    @Test func aCacheIsReplacedWholeWithoutSyncing() throws {
        let path = folder + "/cache"
        try Data("old entries".utf8).write(to: URL(fileURLWithPath: path))
        let output = try OutputFile(path: path, permissions: 0o600, allowsDirectWrites: false)
        try output.write(Array("new".utf8))
        #expect(contents(path) == Array("old entries".utf8))
        try output.finish(durably: false)
        #expect(contents(path) == Array("new".utf8))
        try OutputFile.replaceContents(of: path, with: Array("newer".utf8), permissions: 0o600, allowsDirectWrites: false, durably: false)
        #expect(contents(path) == Array("newer".utf8))
        var info = stat()
        stat(path, &info)
        #expect(info.st_mode & 0o777 == 0o600)
        #expect(leftovers().isEmpty)
    }

    @Test func theFolderOfAPath() {
        #expect(OutputFile.folder(of: "a/b/c") == "a/b")
        #expect(OutputFile.folder(of: "a/b/") == "a")
        #expect(OutputFile.folder(of: "name") == ".")
        #expect(OutputFile.folder(of: "/name") == "/")
        #expect(OutputFile.folder(of: "/") == "/")
        #expect(OutputFile.folder(of: "/a//") == "/")
    }

    @Test func discardingLeavesTheOldFile() throws {
        let path = folder + "/keep"
        try Data("old".utf8).write(to: URL(fileURLWithPath: path))
        let output = try OutputFile(path: path)
        try output.write(Array("half".utf8))
        output.discard()
        #expect(contents(path) == Array("old".utf8))
        #expect(leftovers().isEmpty)
    }

    @Test func aSymlinkStaysALinkAndItsTargetIsReplaced() throws {
        let real = folder + "/real"
        try Data("old".utf8).write(to: URL(fileURLWithPath: real))
        symlink("real", folder + "/link")
        symlink(folder + "/missing", folder + "/dangling")
        try OutputFile.replaceContents(of: folder + "/link", with: Array("new".utf8))
        #expect(kind(folder + "/link") == S_IFLNK)
        #expect(contents(real) == Array("new".utf8))
        try OutputFile.replaceContents(of: folder + "/dangling", with: Array("made".utf8))
        #expect(kind(folder + "/dangling") == S_IFLNK)
        #expect(contents(folder + "/missing") == Array("made".utf8))
    }

    @Test func aNamedPipeIsWrittenLiveAndStaysAPipe() async throws {
        let fifo = folder + "/live.fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        // The reader opens first, as ffplay would, and must see the first bytes before the
        // output is finished: nothing is held back for a rename.
        // Its own thread: blocking opens must not hold the test runner's few shared threads.
        let (got, delivered) = AsyncStream<[UInt8]>.makeStream()
        Thread.detachNewThread {
            let fd = open(fifo, O_RDONLY)
            var buffer = [UInt8](repeating: 0, count: 5)
            let n = read(fd, &buffer, 5)
            close(fd)
            delivered.yield(Array(buffer.prefix(max(n, 0))))
            delivered.finish()
        }
        let output = try OutputFile(path: fifo)
        #expect(output.kind == .fifo && !output.isSeekable)
        try output.write(Array("frame".utf8))
        var received: [UInt8] = []
        for await bytes in got { received = bytes }
        #expect(received == Array("frame".utf8))
        #expect(try !output.patch(Array("x".utf8), at: 0))
        output.discard()
        #expect(kind(fifo) == S_IFIFO)
        #expect(leftovers().isEmpty)
    }

    @Test(.enabled(if: getuid() == 0, "mknod needs root"))
    func aDeviceIsWrittenAndNeverReplaced() throws {
        // A private copy of /dev/null (character device 1:3): writes vanish, the node stays.
        let device = folder + "/null"
        #expect(mknod(device, S_IFCHR | 0o666, makedev(1, 3)) == 0)
        try OutputFile.replaceContents(of: device, with: Array(repeating: 7, count: 100_000))
        #expect(kind(device) == S_IFCHR)
        var info = stat()
        stat(device, &info)
        #expect(info.st_rdev == makedev(1, 3))
        #expect(leftovers().isEmpty)
        // Through a symlink too, as --output pointing at a link to /dev/null.
        symlink(device, folder + "/to-null")
        try OutputFile.replaceContents(of: folder + "/to-null", with: Array("x".utf8))
        #expect(kind(folder + "/to-null") == S_IFLNK && kind(device) == S_IFCHR)
    }

    @Test(.enabled(if: getuid() == 0, "mknod needs root"))
    func aBlockDeviceIsRefused() throws {
        let disk = folder + "/disk"
        #expect(mknod(disk, S_IFBLK | 0o600, makedev(7, 250)) == 0)
        #expect(throws: OutputError.self) { try OutputFile(path: disk) }
        #expect(kind(disk) == S_IFBLK)
    }

    @Test("A symlink to a name that is not UTF-8 is refused, not followed to a name with U+FFFD in its place")
    func aSymlinkToANameNotUTF8IsRefused() throws {
        let target: [UInt8] = Array("caf".utf8) + [0xE9, 0]  // Latin-1 é, then the C string's end
        let made = target.withUnsafeBufferPointer { symlink(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self), folder + "/link") }
        #expect(made == 0)
        let error = #expect(throws: OutputError.self) { try OutputFile.replaceContents(of: folder + "/link", with: Array("new".utf8)) }
        #expect(error?.message.contains("points to a name that is not valid UTF-8") == true, "\(String(describing: error))")
        #expect(kind(folder + "/caf\u{FFFD}") == 0)
    }

    @Test func aFolderIsRefusedWithItsName() throws {
        let error = #expect(throws: OutputError.self) { try OutputFile(path: folder) }
        #expect(error?.message.contains("is a folder") == true)
    }

    @Test("The check before any data: a file whose folder is missing or not a folder is refused; a new file or an existing one in a folder is fine")
    func checkLooksAtTheFolderTheFileIsWrittenIn() throws {
        let missing = #expect(throws: OutputError.self) { try OutputFile.check(folder + "/missing/out.ivf") }
        #expect(missing?.message == "cannot write \(folder)/missing/out.ivf: the folder \(folder)/missing does not exist")
        try Data("x".utf8).write(to: URL(fileURLWithPath: folder + "/plain"))
        #expect(throws: OutputError.self) { try OutputFile.check(folder + "/plain/out.ivf") }
        try OutputFile.check(folder + "/out.ivf")
        try OutputFile.check(folder + "/plain")
        #expect(leftovers().isEmpty && !FileManager.default.fileExists(atPath: folder + "/out.ivf"))  // nothing created
    }

    @Test(.enabled(if: getuid() == 0, "mknod needs root"))
    func configurationRefusesAnythingButAFile() throws {
        let fifo = folder + "/paired.json"
        mkfifo(fifo, 0o600)
        let device = folder + "/known"
        mknod(device, S_IFCHR | 0o666, makedev(1, 3))
        for path in [fifo, device] {
            #expect(throws: OutputError.self) {
                try OutputFile.replaceContents(of: path, with: [1], permissions: 0o600, allowsDirectWrites: false)
            }
        }
        #expect(kind(fifo) == S_IFIFO && kind(device) == S_IFCHR)
        try OutputFile.replaceContents(of: folder + "/new", with: [1], permissions: 0o600, allowsDirectWrites: false)
        var info = stat()
        stat(folder + "/new", &info)
        #expect(info.st_mode & 0o777 == 0o600)
    }

    @Test func aUnixSocketIsConnectedTo() throws {
        let path = folder + "/s"
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(bound == 0 && listen(listener, 1) == 0)
        let output = try OutputFile(path: path)
        #expect(output.kind == .socket)
        try output.write(Array("hi".utf8))
        try output.finish()
        let peer = accept(listener, nil, nil)
        defer { close(peer) }
        var buffer = [UInt8](repeating: 0, count: 8)
        #expect(read(peer, &buffer, 8) == 2)
        #expect(kind(path) == S_IFSOCK)
    }

    @Test func anInheritedDescriptorIsWrittenInPlace() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { close(ends[0]) }
        let output = try OutputFile(path: "/dev/fd/\(ends[1])")
        #expect(output.kind == .fifo)
        try output.write(Array("abc".utf8))
        try output.finish()
        close(ends[1])  // not closed by the output: it belongs to whoever opened it
        var buffer = [UInt8](repeating: 0, count: 8)
        #expect(read(ends[0], &buffer, 8) == 3)
        #expect(OutputFile.inheritedDescriptor("/dev/fd/99999") == nil)
        #expect(OutputFile.inheritedDescriptor("/dev/fd/1x") == nil)
    }
}
