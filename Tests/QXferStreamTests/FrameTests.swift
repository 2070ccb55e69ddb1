import Foundation
import QXferStream
import Testing

@Suite struct FrameTests {
    @Test func expiryIsCaptureTimePlusDeadline() {
        let frame = Frame(index: 0, isKeyframe: true, captureTime: 5_000_000_000, deadline: .milliseconds(150), payload: Data())
        #expect(frame.expiry == 5_150_000_000)
    }
}
