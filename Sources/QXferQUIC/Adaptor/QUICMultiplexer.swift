import NIOCore
import QUICEngine
@_spi(Stacks) import QXferCore

/// A QUIC connection's other streams and its datagrams.
struct QUICMultiplexer: StreamMultiplexer {
    let driver: NIOLoopBound<QUICConnectionDriver>
    let peer: PeerIdentity

    func openStream() async throws -> any ByteStreamTransport {
        let driver = self.driver
        while true {
            let opened = try await driver.eventLoop.submit { try driver.value.openStream() }.get()
            if let id = opened {
                return QUICStreamTransport(
                    driver: driver, stream: driver.eventLoop.makeSucceededFuture(id), peer: peer, isPrimary: false)
            }
            try await driver.eventLoop.flatSubmit { driver.value.streamsAvailable() }.get()
        }
    }

    func acceptStream() async throws -> (any ByteStreamTransport)? {
        let driver = self.driver
        guard let id = try await driver.eventLoop.flatSubmit({ driver.value.acceptStream() }).get() else { return nil }
        return QUICStreamTransport(driver: driver, stream: driver.eventLoop.makeSucceededFuture(id), peer: peer, isPrimary: false)
    }

    func sendDatagram(_ payload: ByteBuffer) async throws {
        let driver = self.driver
        try await driver.eventLoop.submit { try driver.value.sendDatagram(payload) }.get()
    }

    func receiveDatagram() async throws -> ByteBuffer? {
        let driver = self.driver
        return try await driver.eventLoop.flatSubmit { driver.value.receiveDatagram() }.get().map { ByteBuffer(bytes: $0) }
    }

    func migrate(localHost: String?) async throws {
        let driver = self.driver
        let (remoteIsIPv6, options) = try await driver.eventLoop.submit {
            (driver.value.engine.path.remote.isIPv6, driver.value.socketOptions)
        }.get()
        // The new socket must live on the connection's own event loop: the driver is confined to it.
        let channel = try await QUICSockets.openClientSocket(
            on: driver.eventLoop, host: localHost ?? QUICSockets.wildcardHost(ipv6: remoteIsIPv6), options: options)
        do {
            try await driver.eventLoop.submit {
                let driver = driver.value
                let handler = try channel.pipeline.syncOperations.handler(type: QUICSocketHandler.self)
                guard let local = handler.localAddress else { throw QXferError(.invalidUse, "the new socket has no address") }
                let old = driver.endpoint
                old?.detach(client: driver)
                handler.attach(client: driver)
                do {
                    try driver.engine.migrate(toLocalAddress: local, now: QUICConnectionDriver.now)
                } catch {
                    throw QXferError(.invalidUse, "cannot migrate the connection: \(error)")
                }
                driver.process()
                old?.channel?.close(promise: nil)
            }.get()
        } catch {
            try? await channel.close()
            throw error
        }
    }

    func close(errorCode: UInt64, reason: String) {
        let driver = self.driver
        driver.eventLoop.execute { driver.value.closeGracefully(code: errorCode, reason: reason) }
    }

    func maximumDatagramSize() async -> Int? {
        let driver = self.driver
        return (try? await driver.eventLoop.submit { driver.value.engine.maxDatagramPayloadSize }.get()) ?? nil
    }
}
