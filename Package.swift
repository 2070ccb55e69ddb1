// swift-tools-version:6.1
import PackageDescription

let strictSwift6: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "qxfer",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "QXfer", targets: ["QXfer"]),
        .executable(name: "qxfer", targets: ["qxfer"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
    ],
    targets: [
        // C shims: ngtcp2 0.12.1 + its GnuTLS crypto helper + GnuTLS, macros as inline functions.
        .target(
            name: "CNGTCP2",
            linkerSettings: [
                .linkedLibrary("ngtcp2"),
                .linkedLibrary("ngtcp2_crypto_gnutls"),
                .linkedLibrary("gnutls"),
            ]
        ),
        // QUIC packet protection with the BoringSSL swift-crypto builds (AES-GCM with VAES and
        // AVX-512 where the CPU has them): the backend QXferQUIC hands the engine. GnuTLS keeps
        // the handshake; the engine itself stays free of other packages (its default backend is
        // ngtcp2_crypto_gnutls's).
        .target(
            name: "CQUICPacketProtection",
            dependencies: ["CNGTCP2", .product(name: "Crypto", package: "swift-crypto")]
        ),
        // Linux socket structures the Glibc module lacks (the kernel's tcp_info).
        .target(name: "CQXferLinux"),
        // P-256 point arithmetic for the pairing PAKE, from OpenSSL's libcrypto.
        .target(
            name: "CP256",
            // libcrypto itself is loaded on first use (dlopen), not linked.
            linkerSettings: [.linkedLibrary("dl")]
        ),
        // CP256 behind a Swift type (P256Group), so the pairing module reaches no C.
        .target(
            name: "PairingGroup",
            dependencies: ["CP256"],
            swiftSettings: strictSwift6
        ),
        // The Linux calls the applications need (malloc arenas, punching holes, a pthread lock
        // ThreadSanitizer sees) behind Swift types.
        // Numbers and JSON lines as text, without Foundation's formatters.
        .target(
            name: "PlainText",
            swiftSettings: strictSwift6
        ),

        .target(
            name: "LinuxSystem",
            dependencies: ["CQXferLinux"],
            swiftSettings: strictSwift6
        ),

        // The sans-IO QUIC engine around ngtcp2_conn: datagrams and "now" in, datagrams,
        // events and the next timer out. No sockets, no clock, no NIO.
        .target(
            name: "QUICEngine",
            dependencies: ["CNGTCP2"],
            swiftSettings: strictSwift6
        ),

        // Writing an output without replacing what the path names: regular files through a
        // temporary file and a rename, devices, pipes and sockets directly. Glibc only.
        .target(
            name: "SafeOutput",
            dependencies: ["CFileSystemLinux"],
            swiftSettings: strictSwift6
        ),
        // Linux file-system calls the Glibc module lacks (renameat2, statfs), for SafeOutput.
        .target(name: "CFileSystemLinux"),

        // The userspace link emulator (delay, rate, queue, loss between two TUN devices).
        .executableTarget(
            name: "qxfer-linkemu",
            dependencies: ["SafeOutput"],
            path: "Sources/LinkEmulator",
            swiftSettings: strictSwift6
        ),

        // XXH3-128 from Debian's libxxhash, for end-to-end file checks.
        .target(
            name: "CXXHash",
            linkerSettings: [.linkedLibrary("xxhash")]
        ),
        // XXH3 behind Swift types, so no application target imports the C module.
        .target(
            name: "FastHash",
            dependencies: ["CXXHash"],
            swiftSettings: strictSwift6
        ),

        // The layers of the library, each a target so that a forbidden import fails the build
        // (docs/ARCHITECTURE.md has the graph; scripts/check-architecture.py checks it): the
        // umbrella QXfer over the stacks (QXferTLS, QXferQUIC) and QXferDiscovery, the stacks over
        // QXferSockets and QXferIdentity, everything over QXferCore.

        // The connection API: endpoints, the stack builder, NetworkConnection/Listener, framers,
        // states, metrics, errors, and the seam every stack implements (TransportStack).
        // No sockets, no C, no stack: NIOCore only for ByteBuffer, the currency of the seam.
        .target(
            name: "QXferCore",
            dependencies: [
                "PlainText",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOFoundationEssentialsCompat", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // The host identity and trust: key and certificate, known hosts, paired devices, the
        // trust settings both stacks share and the verifier that applies them.
        .target(
            name: "QXferIdentity",
            dependencies: [
                "QXferCore",
                "PlainText",
                "SafeOutput",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strictSwift6
        ),

        // What both stacks share about NIO sockets: error wording, the every-address bind,
        // socket address → Endpoint.
        .target(
            name: "QXferSockets",
            dependencies: [
                "QXferCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strictSwift6
        ),

        // The TCP+TLS stack: swift-nio-ssl, child connections for extra streams and datagrams.
        .target(
            name: "QXferTLS",
            dependencies: [
                "LinuxSystem",
                "QXferCore",
                "QXferIdentity",
                "QXferSockets",
                "CQXferLinux",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // The QUIC stack, shaped as quinn is: the sans-IO engine (QUICEngine) below, the endpoint
        // that owns the UDP socket, a driver per connection, the adaptor to the API's seam.
        .target(
            name: "QXferQUIC",
            dependencies: [
                "LinuxSystem",
                "QXferCore",
                "QXferIdentity",
                "QXferSockets",
                "QUICEngine",
                "CQUICPacketProtection",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // Finding peers on the local network: mDNS / DNS-SD (NetworkBrowser, NetworkAdvertiser).
        .target(
            name: "QXferDiscovery",
            dependencies: [
                "QXferCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // A stack built from others: `FirstOf { QUIC(); TLS() }` races them (RFC 8305's staggered
        // attempts) and connects with whichever completes its handshake first. Knows the stacks
        // it races only through the TransportStack seam.
        .target(
            name: "QXferRace",
            dependencies: [
                "QXferCore",
                "QXferIdentity",
                "SafeOutput",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // The library as a program imports it: one `import QXfer` for all of the above.
        .target(
            name: "QXfer",
            dependencies: ["QXferCore", "QXferIdentity", "QXferTLS", "QXferQUIC", "QXferRace", "QXferDiscovery"],
            swiftSettings: strictSwift6
        ),

        // File transfer (qxfer/1 send/recv), written only against the public API.
        .target(
            name: "QXferTransfer",
            dependencies: ["QXfer", "FastHash", "SafeOutput", "LinuxSystem", "PlainText", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSwift6
        ),

        // Live frames: sources and sinks (synthetic, IVF, Y4M), the reliable / stream-per-frame /
        // realtime modes, loss repair and latency statistics, over the public API only.
        .target(
            name: "QXferStream",
            dependencies: ["QXfer", "SafeOutput", "LinuxSystem", "PlainText", .product(name: "Histogram", package: "hdrhistogram-swift")],
            swiftSettings: strictSwift6
        ),

        // Pairing two machines with a short code: SPAKE2 (RFC 9382) bound to the connection,
        // over the public API only.
        .target(
            name: "QXferPairing",
            dependencies: ["QXfer", "PairingGroup", "PlainText", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSwift6
        ),

        // Reach across NATs: transfer codes, the relay (server and client), candidates, hole
        // punching and the local path agent that carries both stacks' connections over the
        // relay or a direct path (docs/PROTOCOL.md §9). Raw sockets through NIOPosix; the
        // connections themselves through the public API.
        .target(
            name: "QXferReach",
            dependencies: [
                "QXfer", "QXferPairing", "PlainText", "LinuxSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSwift6
        ),

        // The command-line tool: composition only.
        .executableTarget(
            name: "qxfer",
            dependencies: [
                "LinuxSystem",
                "PlainText",
                "QXfer",
                "QXferTransfer",
                "QXferStream",
                "QXferPairing",
                "QXferReach",
                "SafeOutput",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift6
        ),

        // samples/: the public API as a newcomer meets it.
        .executableTarget(
            name: "qxfer-demo",
            dependencies: ["QXfer"],
            path: "samples/LoopbackDemo",
            swiftSettings: strictSwift6
        ),

        .executableTarget(
            name: "echo-tls",
            dependencies: ["QXfer"],
            path: "samples/EchoTLS",
            swiftSettings: strictSwift6
        ),
        .executableTarget(
            name: "echo-quic",
            dependencies: ["QXfer"],
            path: "samples/EchoQUIC",
            swiftSettings: strictSwift6
        ),

        .executableTarget(
            name: "qxfer-bycode",
            dependencies: ["QXfer", "QXferReach"],
            path: "samples/ByCode",
            swiftSettings: strictSwift6
        ),

        // bench/: qxfer-bench, bulk throughput of one connection (sink and source processes).
        .executableTarget(
            name: "qxfer-bench",
            dependencies: ["QXfer"],
            path: "bench/Throughput",
            swiftSettings: strictSwift6
        ),

        // Starting and watching child programs in tests, without Foundation's Process
        // (Tests/Subprocesses/ChildProcess.swift says why).
        .target(
            name: "Subprocesses",
            dependencies: ["LinuxSystem"],
            path: "Tests/Subprocesses",
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferTests",
            dependencies: [
                "QXfer",
                "QXferCore",
                "QXferIdentity",
                "QXferSockets",
                "QXferTLS",
                "QXferQUIC",
                "QXferRace",
                "QXferDiscovery",
                "QUICEngine",
                "LinuxSystem",
                "Subprocesses",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            exclude: ["Interop"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferTransferTests",
            dependencies: ["QXferTransfer", "QXfer", "LinuxSystem", "Subprocesses"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferStreamTests",
            dependencies: ["QXferStream", "QXfer", "LinuxSystem", "Subprocesses"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferPairingTests",
            dependencies: ["QXferPairing", "QXfer"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferReachTests",
            dependencies: ["QXferReach", "QXferPairing", "QXfer", "LinuxSystem", "PlainText", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "SafeOutputTests",
            dependencies: ["SafeOutput"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QUICEngineTests",
            dependencies: ["QUICEngine", "CNGTCP2", "CQUICPacketProtection", "LinuxSystem"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "PlainTextTests",
            dependencies: ["PlainText"],
            swiftSettings: strictSwift6
        ),
        .testTarget(
            name: "QXferCLITests",
            dependencies: [
                "qxfer", "PlainText", "echo-tls", "echo-quic", "Subprocesses",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),  // HelpTests parses each example
            ],
            swiftSettings: strictSwift6
        ),
    ]
)
