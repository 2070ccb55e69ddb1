/// A fuzz input read as a script, one step at a time: bytes past its end read as zero, so any
/// input is a whole script (the relay and peer targets).
struct FuzzScript {
    private let bytes: [UInt8]
    private var index = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var isEmpty: Bool { index >= bytes.count }
    mutating func byte() -> UInt8 {
        defer { index += 1 }
        return index < bytes.count ? bytes[index] : 0
    }
    mutating func take(_ count: Int) -> [UInt8] {
        let end = min(index + count, bytes.count)
        defer { index = end }
        return index < end ? Array(bytes[index..<end]) : []
    }
}
