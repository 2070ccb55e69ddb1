import Foundation
import Testing

/// The samples a newcomer runs: the echo program over TLS and over QUIC, which differ in
/// one line of source, both move their bytes intact.
@Suite("samples")
struct SampleTests {
    @Test("echo-tls and echo-quic echo 4 MiB intact", arguments: ["echo-tls", "echo-quic"])
    func echo(sample: String) async throws {
        let qxfer = try #require(CLITests.executable, "the built products were not found")
        let executable = URL(fileURLWithPath: qxfer).deletingLastPathComponent().appendingPathComponent(sample).path
        try #require(FileManager.default.isExecutableFile(atPath: executable), "\(sample) was not built")
        let run = try await CLITests.run(executable, ["4"], timeout: .seconds(60))
        #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
        #expect(run.stdout.contains("echoed 4194304 bytes intact"), "\(run.stdout)")
    }

    @Test("The two echo samples differ in exactly the stack line (and their comments)")
    func oneLineSwap() throws {
        let samples = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("samples")
        func code(_ path: String) throws -> [Substring] {
            try String(contentsOf: samples.appendingPathComponent(path), encoding: .utf8)
                .split(separator: "\n", omittingEmptySubsequences: false)
                .filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("//") }
        }
        let tls = try code("EchoTLS/EchoTLS.swift")
        let quic = try code("EchoQUIC/EchoQUIC.swift")
        #expect(tls.count == quic.count)
        let differing = zip(tls, quic).filter { $0 != $1 }
        #expect(differing.count == 1)
        #expect(differing.first?.0.contains("TLS()") == true && differing.first?.1.contains("QUIC()") == true)
    }
}
