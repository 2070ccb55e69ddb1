/// Per-stream bookkeeping of a ``QUICConnection``.
final class StreamState {
    let id: QUICStreamID
    /// Unacknowledged outgoing bytes (nil for a receive-only stream).
    let send: StreamSendBuffer?
    /// Received bytes the application has not read.
    var receive = ByteQueue()

    /// The application asked to end the sending side after the buffered bytes.
    var finRequested = false
    /// The FIN has been handed to ngtcp2.
    var finSent = false
    /// RESET_STREAM was sent or the stream cannot be written any more.
    var sendClosed = false
    /// A write was cut short; emit ``QUICEvent/streamWritable(_:)`` when room frees up.
    var wantsWritable = false
    /// ngtcp2 reported NGTCP2_ERR_STREAM_DATA_BLOCKED; wait for `extend_max_stream_data`.
    var flowBlocked = false

    /// The peer's FIN arrived.
    var finReceived = false
    /// The application has read through the FIN (or the receive side was reset/stopped).
    var receiveDone = false
    /// ngtcp2 closed the stream (`stream_close`); forget it once the receive buffer is drained.
    var closed = false
    /// Last `ngtcp2_conn_get_stream_loss_count` seen for this stream.
    var lossCount: UInt64 = 0

    init(id: QUICStreamID, canSend: Bool, canReceive: Bool, blocks: SendBlockPool) {
        self.id = id
        self.send = canSend ? StreamSendBuffer(pool: blocks) : nil
        self.receiveDone = !canReceive
    }

    /// Whether the stream has something for `ngtcp2_conn_writev_stream`.
    var hasPendingSend: Bool {
        guard let send, !sendClosed else { return false }
        return send.unsentBytes > 0 || (finRequested && !finSent)
    }
}
