import Testing
import QXfer

/// Destinations as people type them on the command line (`send`, `stream send`, `pair`).
@Suite("Endpoints typed by a person")
struct EndpointParsingTests {
    @Test func hostsPortsAndIPv6Literals() {
        func parsed(_ text: String) -> String? { Endpoint(parsing: text, defaultPort: 7447).map(\.description) }
        #expect(parsed("otherhost") == "otherhost:7447")
        #expect(parsed("otherhost:9000") == "otherhost:9000")
        #expect(parsed("10.0.0.2:65535") == "10.0.0.2:65535")
        #expect(parsed("[fd00::2]:9000") == "[fd00::2]:9000")
        #expect(parsed("[fe80::1%eth0]") == "[fe80::1%eth0]:7447")
        #expect(parsed("fd00::2") == "[fd00::2]:7447")  // a bare IPv6 address takes the default port
    }

    /// Nothing can be reached at port 0 or at an empty host: said as a usage error at once,
    /// not as a connection that fails.
    @Test func refusesWhatCannotBeReached() {
        for text in ["", "host:0", "[fd00::2]:0", ":7447", "[]", "[]:7447", "host:", "host:65536", "host:-1", "[fd00::2]x", "[fd00::2"] {
            #expect(Endpoint(parsing: text, defaultPort: 7447) == nil, "'\(text)'")
        }
    }
}
