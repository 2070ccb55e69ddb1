import Crypto
import NIOCore
import NIOSSL
@_spi(Stacks) import QXferCore

/// TLS 1.3 exporter values (RFC 8446 section 7.5) for the TCP+TLS stack.
///
/// swift-nio-ssl offers no exporter, but its key-log callback hands out BoringSSL's
/// `EXPORTER_SECRET` line (the exporter master secret, keyed by the ClientHello's random).
/// ``ClientRandomObserver`` reads that random off the wire as the handshake passes, so each
/// connection finds its own secret, and ``TLSExporter`` derives values from it exactly as
/// RFC 8446 does (checked against `openssl s_client -keymatexport` in the interop tests).
/// Only the exporter secret is kept; the traffic secrets in the other lines are ignored.
final class ExporterSecrets: Sendable {
    /// Secrets by client random, waiting for their connection to take them. A connection whose
    /// handshake fails after the secret was logged removes its entry when it closes; the bound
    /// guards against anything else.
    private let waiting = Locked<[[UInt8]: [UInt8]]>([:])
    private static let bound = 4096

    /// The callback for `TLSConfiguration.keyLogCallback`.
    var keyLogCallback: NIOSSLKeyLogCallback {
        { [self] line in record(line) }
    }

    func record(_ line: ByteBuffer) {
        let text = String(buffer: line)
        let fields = text.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\r" })
        guard fields.count == 3, fields[0] == "EXPORTER_SECRET",
              let random = Fingerprint.bytes(hex: fields[1]), random.count == 32,
              let secret = Fingerprint.bytes(hex: fields[2]), secret.count == 32 || secret.count == 48 else { return }
        waiting.withLock { waiting in
            if waiting.count < Self.bound { waiting[random] = secret }
        }
    }

    /// The exporter secret of the connection whose ClientHello carried `random`, once.
    func take(clientRandom random: [UInt8]) -> [UInt8]? {
        waiting.withLock { $0.removeValue(forKey: random) }
    }
}

/// Reads the 32-byte random of the ClientHello as it passes: inbound on a server, outbound on a
/// client. Sits below the TLS handler, sees only the first 43 bytes of the connection, and
/// forwards everything untouched.
final class ClientRandomObserver: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// TLS record header (5) + handshake header (4) + legacy_version (2), then the random.
    private static let randomOffset = 11
    private static let randomLength = 32

    private let watchesInbound: Bool
    private let secrets: ExporterSecrets
    private var prefix: [UInt8] = []
    private(set) var clientRandom: [UInt8]?

    init(isServer: Bool, secrets: ExporterSecrets) {
        self.watchesInbound = isServer
        self.secrets = secrets
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if watchesInbound && clientRandom == nil { observe(unwrapInboundIn(data)) }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if !watchesInbound && clientRandom == nil { observe(unwrapOutboundIn(data)) }
        context.write(data, promise: promise)
    }

    /// The connection's exporter, once its handshake is complete; nil if the secret was not seen.
    func takeExporter() -> TLSExporter? {
        guard let clientRandom, let secret = secrets.take(clientRandom: clientRandom) else { return nil }
        return TLSExporter(secret: secret)
    }

    func channelInactive(context: ChannelHandlerContext) {
        forget()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) { forget() }

    private func forget() {
        if let clientRandom { _ = secrets.take(clientRandom: clientRandom) }
    }

    private func observe(_ buffer: ByteBuffer) {
        let needed = Self.randomOffset + Self.randomLength - prefix.count
        guard needed > 0, let bytes = buffer.getBytes(at: buffer.readerIndex, length: min(needed, buffer.readableBytes)) else { return }
        prefix += bytes
        guard prefix.count == Self.randomOffset + Self.randomLength else { return }
        // A handshake record (22) carrying a ClientHello (1); anything else is no TLS we export from.
        if prefix[0] == 22 && prefix[5] == 1 {
            clientRandom = Array(prefix[Self.randomOffset...])
        } else {
            clientRandom = []
        }
    }
}

/// Derives exporter values from a TLS 1.3 exporter master secret (RFC 8446 section 7.5).
struct TLSExporter: Sendable {
    /// `exporter_master_secret`; its length tells the cipher suite's hash (32: SHA-256, 48: SHA-384).
    let secret: [UInt8]

    /// `TLS-Exporter(label, context, length)`.
    func export(label: String, context: [UInt8], length: Int) -> [UInt8] {
        if secret.count == SHA384.byteCount {
            return Self.export(SHA384.self, secret: secret, label: label, context: context, length: length)
        }
        return Self.export(SHA256.self, secret: secret, label: label, context: context, length: length)
    }

    private static func export<H: HashFunction>(_ hash: H.Type, secret: [UInt8], label: String, context: [UInt8], length: Int) -> [UInt8] {
        // Derive-Secret(secret, label, "") then HKDF-Expand-Label(that, "exporter", Hash(context), length).
        let derived = expandLabel(H.self, secret: secret, label: label, context: Array(H.hash(data: [UInt8]())), length: H.Digest.byteCount)
        return expandLabel(H.self, secret: derived, label: "exporter", context: Array(H.hash(data: context)), length: length)
    }

    private static func expandLabel<H: HashFunction>(_ hash: H.Type, secret: [UInt8], label: String, context: [UInt8], length: Int) -> [UInt8] {
        let fullLabel = Array("tls13 ".utf8) + Array(label.utf8)
        var info: [UInt8] = [UInt8(length >> 8), UInt8(length & 0xFF), UInt8(fullLabel.count)]
        info += fullLabel
        info.append(UInt8(context.count))
        info += context
        let key = HKDF<H>.expand(pseudoRandomKey: SymmetricKey(data: secret), info: info, outputByteCount: length)
        return key.withUnsafeBytes { Array($0) }
    }
}
