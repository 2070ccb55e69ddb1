import FoundationEssentials
import Glibc

/// One video frame on its way from a source to a sink: its bytes, when it was captured and by
/// when it must arrive to still be useful.
public struct Frame: Sendable, Hashable {
    /// Position in the source, from 0.
    public var index: UInt64
    /// Whether the frame can be decoded on its own (a keyframe); later frames depend on it.
    public var isKeyframe: Bool
    /// The capture time, in nanoseconds of the sender's clock.
    public var captureTime: UInt64
    /// How long after `captureTime` the frame is still worth delivering.
    public var deadline: Duration
    /// The presentation timestamp in the container's time base (IVF's pts); the index when the
    /// source has none.
    public var timestamp: UInt64
    /// The encoded frame.
    public var payload: Data

    public init(index: UInt64, isKeyframe: Bool, captureTime: UInt64, deadline: Duration, payload: Data, timestamp: UInt64? = nil) {
        self.index = index
        self.isKeyframe = isKeyframe
        self.captureTime = captureTime
        self.deadline = deadline
        self.timestamp = timestamp ?? index
        self.payload = payload
    }

    /// The instant (sender's clock, nanoseconds) after which the frame is late.
    /// Saturates at the end of time: a capture time near 2^64 from a hostile sender must not
    /// wrap round to an expiry long past, which would make the playout skip ahead at once.
    public var expiry: UInt64 {
        let (seconds, attoseconds) = deadline.components
        let (secondsPart, secondsOverflow) = UInt64(max(0, seconds)).multipliedReportingOverflow(by: 1_000_000_000)
        let (length, lengthOverflow) = secondsPart.addingReportingOverflow(UInt64(max(0, attoseconds / 1_000_000_000)))
        let (end, endOverflow) = captureTime.addingReportingOverflow(length)
        return secondsOverflow || lengthOverflow || endOverflow ? .max : end
    }
}

/// The sender's and receiver's clock: wall-clock time in nanoseconds (`CLOCK_REALTIME`).
///
/// Wall time rather than a monotonic clock because two hosts' wall clocks are already close
/// (NTP), so the offset the stream estimates is a small correction a person can read; the
/// estimate, not the clock, makes latencies honest across machines.
public enum WallClock {
    /// Now, in nanoseconds since the Unix epoch.
    public static func now() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return UInt64(spec.tv_sec) &* 1_000_000_000 &+ UInt64(spec.tv_nsec)
    }
}
