import Glibc
internal import LinuxSystem

/// Where a file's data lies between its holes, as its file system reports them
/// (`lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)`): the sender sends Zeros for the long holes
/// (docs/PROTOCOL.md §3.8) and FileData for the rest.
enum FileHoles {
    /// The shortest hole worth a Zeros message. A shorter one goes as data (the receiver leaves
    /// its zeros unwritten all the same): a file of many small holes then travels in full chunks,
    /// not in a message per run (one of 4 KiB data, 4 KiB holes took 10 times as long), and
    /// Zeros never outnumber the chunks the same bytes would take.
    static let minimumHole = UInt64(ProtocolLimits.maximumChunkSize)

    /// The next span to send as data from `offset`: from the first data at or after it (from
    /// `offset` itself when the hole before that is shorter than ``minimumHole``) through the
    /// runs of data that follow with only short holes between them, until a long hole, the
    /// end (`size`), or at least `length` bytes. Empty at `size` when only a long hole is left;
    /// the caller sends Zeros up to its start.
    static func dataSpan(in file: Descriptor, from offset: UInt64, size: UInt64, length: UInt64) -> Range<UInt64> {
        let first = dataRun(in: file, from: offset, size: size)
        let start = first.lowerBound - offset < minimumHole ? offset : first.lowerBound
        var end = first.upperBound
        while end < size, end - start < length {
            let next = dataRun(in: file, from: end, size: size)  // past `end`, or empty at `size`
            guard next.lowerBound - end < minimumHole else { break }
            end = next.upperBound
        }
        return start..<end
    }

    /// The bytes from `offset` to `size` that the sender will send as Zeros: the long holes
    /// between the spans ``dataSpan(in:from:size:length:)`` finds, as the sender walks them.
    /// What the file system does not report as holes counts as data.
    static func holeBytes(in file: Descriptor, from offset: UInt64, size: UInt64) -> UInt64 {
        var position = offset, holes: UInt64 = 0
        while position < size {
            let data = dataSpan(in: file, from: position, size: size, length: .max)
            holes += data.lowerBound - position  // spans start at or after `position`
            guard data.upperBound > position else { break }  // at `size`: only a hole was left
            position = data.upperBound
        }
        return holes
    }

    /// The first run of data at or after `offset`, both ends at most `size` (the size offered:
    /// the file may have grown since). Empty at `size` when only a hole is left; from `offset`
    /// to `size` where the file system does not tell (it then reports one run of data), and
    /// where the file is now shorter than `size`: reading it finds the end, and the sender
    /// reports a file that shrank, as without holes.
    static func dataRun(in file: Descriptor, from offset: UInt64, size: UInt64) -> Range<UInt64> {
        guard offset < size, let position = Int64(exactly: offset) else { return size..<size }
        let start = FileSpace.nextData(descriptor: file.fd, from: position)
        if start < 0 {
            // ENXIO: no data past offset, or offset past the end of a file that shrank.
            var info = stat()
            let holeToTheEnd = errno == ENXIO && fstat(file.fd, &info) == 0 && UInt64(clamping: info.st_size) >= size
            return holeToTheEnd ? size..<size : offset..<size
        }
        let end = FileSpace.nextHole(descriptor: file.fd, from: start)
        let first = min(UInt64(start), size)  // lseek returns offsets ≥ 0 on success
        let last = end < 0 ? size : min(UInt64(end), size)
        // A run that does not reach past `offset` (a file changing under us): the rest as data.
        guard last > offset, last > first else { return offset..<size }
        return max(first, offset)..<last
    }
}
