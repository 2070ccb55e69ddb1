import Testing
@testable import QXferPairing

/// RFC 9382 Appendix B: SPAKE2-P256-SHA256-HKDF-HMAC, all four published vectors.
struct SPAKE2VectorTests {
    struct Vector: Sendable, CustomTestStringConvertible {
        var a, b, w, x, y, pA, pB, ke, confirmationA, confirmationB: String
        var testDescription: String { "A='\(a)' B='\(b)'" }
    }

    static let vectors = [
        Vector(
            a: "server", b: "client",
            w: "2ee57912099d31560b3a44b1184b9b4866e904c49d12ac5042c97dca461b1a5f",
            x: "43dd0fd7215bdcb482879fca3220c6a968e66d70b1356cac18bb26c84a78d729",
            y: "dcb60106f276b02606d8ef0a328c02e4b629f84f89786af5befb0bc75b6e66be",
            pA: "04a56fa807caaa53a4d28dbb9853b9815c61a411118a6fe516a8798434751470f9010153ac33d0d5f2047ffdb1a3e42c9b4e6be662766e1eeb4116988ede5f912c",
            pB: "0406557e482bd03097ad0cbaa5df82115460d951e3451962f1eaf4367a420676d09857ccbc522686c83d1852abfa8ed6e4a1155cf8f1543ceca528afb591a1e0b7",
            ke: "0e0672dc86f8e45565d338b0540abe69",
            confirmationA: "58ad4aa88e0b60d5061eb6b5dd93e80d9c4f00d127c65b3b35b1b5281fee38f0",
            confirmationB: "d3e2e547f1ae04f2dbdbf0fc4b79f8ecff2dff314b5d32fe9fcef2fb26dc459b"),
        Vector(
            a: "", b: "client",
            w: "0548d8729f730589e579b0475a582c1608138ddf7054b73b5381c7e883e2efae",
            x: "403abbe3b1b4b9ba17e3032849759d723939a27a27b9d921c500edde18ed654b",
            y: "903023b6598908936ea7c929bd761af6039577a9c3f9581064187c3049d87065",
            pA: "04a897b769e681c62ac1c2357319a3d363f610839c4477720d24cbe32f5fd85f44fb92ba966578c1b712be6962498834078262caa5b441ecfa9d4a9485720e918a",
            pB: "04e0f816fd1c35e22065d5556215c097e799390d16661c386e0ecc84593974a61b881a8c82327687d0501862970c64565560cb5671f696048050ca66ca5f8cc7fc",
            ke: "642f05c473c2cd79909f9a841e2f30a7",
            confirmationA: "47d29e6666af1b7dd450d571233085d7a9866e4d49d2645e2df975489521232b",
            confirmationB: "3313c5cefc361d27fb16847a91c2a73b766ffa90a4839122a9b70a2f6bd1d6df"),
        Vector(
            a: "server", b: "",
            w: "626e0cdc7b14c9db3e52a0b1b3a768c98e37852d5db30febe0497b14eae8c254",
            x: "07adb3db6bc623d3399726bfdbfd3d15a58ea776ab8a308b00392621291f9633",
            y: "b6a4fc8dbb629d4ba51d6f91ed1532cf87adec98f25dd153a75accafafedec16",
            pA: "04f88fb71c99bfffaea370966b7eb99cd4be0ff1a7d335caac4211c4afd855e2e15a873b298503ad8ba1d9cbb9a392d2ba309b48bfd7879aefd0f2cea6009763b0",
            pB: "040c269d6be017dccb15182ac6bfcd9e2a14de019dd587eaf4bdfd353f031101e7cca177f8eb362a6e83e7d5e729c0732e1b528879c086f39ba0f31a9661bd34db",
            ke: "005184ff460da2ce59062c87733c299c",
            confirmationA: "bc9f9bbe99f26d0b2260e6456e05a86196a3307ec6663a18bf6ac825736533b2",
            confirmationB: "c2370e1bf813b086dff0d834e74425a06e6390f48f5411900276dcccc5a297ec"),
        Vector(
            a: "", b: "",
            w: "7bf46c454b4c1b25799527d896508afd5fc62ef4ec59db1efb49113063d70cca",
            x: "8cef65df64bb2d0f83540c53632de911b5b24b3eab6cc74a97609fd659e95473",
            y: "d7a66f64074a84652d8d623a92e20c9675c61cb5b4f6a0063e4648a2fdc02d53",
            pA: "04a65b367a3f613cf9f0654b1b28a1e3a8a40387956c8ba6063e8658563890f46ca1ef6a676598889fc28de2950ab8120b79a5ef1ea4c9f44bc98f585634b46d66",
            pB: "04589f13218822710d98d8b2123a079041052d9941b9cf88c6617ddb2fcc0494662eea8ba6b64692dc318250030c6af045cb738bc81ba35b043c3dcb46adf6f58d",
            ke: "fc6374762ba5cf11f4b2caa08b2cd1b9",
            confirmationA: "dfb4db8d48ae5a675963ea5e6c19d98d4ea028d8e898dad96ea19a80ade95dca",
            confirmationB: "d0f0609d1613138d354f7e95f19fb556bf52d751947241e8c7118df5ef0ae175"),
    ]

    @Test(arguments: vectors)
    func reproducesTheRFCVector(_ vector: Vector) throws {
        var a = try SPAKE2(role: .a, w: hex(vector.w), secret: hex(vector.x), identityA: Array(vector.a.utf8), identityB: Array(vector.b.utf8))
        var b = try SPAKE2(role: .b, w: hex(vector.w), secret: hex(vector.y), identityA: Array(vector.a.utf8), identityB: Array(vector.b.utf8))
        let pA = try a.start(), pB = try b.start()
        #expect(pA == hex(vector.pA))
        #expect(pB == hex(vector.pB))
        let confirmationA = try a.finish(peerShare: pB)
        let confirmationB = try b.finish(peerShare: pA)
        #expect(confirmationA == hex(vector.confirmationA))
        #expect(confirmationB == hex(vector.confirmationB))
        #expect(try a.verify(peerConfirmation: confirmationB) == hex(vector.ke))
        #expect(try b.verify(peerConfirmation: confirmationA) == hex(vector.ke))
    }
}

struct PairingNameTests {
    @Test(arguments: ["laptop", "Ada's phone", "bürö-pc", String(repeating: "x", count: 64)])
    func acceptableNames(_ name: String) { #expect(Pairing.isAcceptableName(name)) }

    @Test(arguments: ["", String(repeating: "x", count: 65), "evil\u{1b}[2J", "line\nbreak", "abc\u{202e}gpj.exe"])
    func refusedNames(_ name: String) { #expect(!Pairing.isAcceptableName(name)) }

    @Test func peerTextIsMadePrintable() {
        #expect(Pairing.printable("no\u{1b}[31m red\u{202e}") == "no?[31m red?")
        #expect(Pairing.printable(String(repeating: "a", count: 500)).count == 200)
    }
}

struct SPAKE2BehaviourTests {
    let domain = "qxfer test"

    @Test func samePasswordAgreesOnAKey() throws {
        let w = SPAKE2.passwordScalar(Array("482913".utf8), domain: domain)
        var a = try SPAKE2(role: .a, w: w, identityA: [1], identityB: [2])
        var b = try SPAKE2(role: .b, w: w, identityA: [1], identityB: [2])
        let pA = try a.start(), pB = try b.start()
        let cA = try a.finish(peerShare: pB, additionalData: [9, 9]), cB = try b.finish(peerShare: pA, additionalData: [9, 9])
        #expect(try a.verify(peerConfirmation: cB) == b.verify(peerConfirmation: cA))
    }

    @Test func wrongPasswordFailsOnBothSides() throws {
        var a = try SPAKE2(role: .a, w: SPAKE2.passwordScalar(Array("482913".utf8), domain: domain), identityA: [1], identityB: [2])
        var b = try SPAKE2(role: .b, w: SPAKE2.passwordScalar(Array("482914".utf8), domain: domain), identityA: [1], identityB: [2])
        let pA = try a.start(), pB = try b.start()
        let cA = try a.finish(peerShare: pB), cB = try b.finish(peerShare: pA)
        #expect(throws: SPAKE2.Failure.confirmationMismatch) { try a.verify(peerConfirmation: cB) }
        #expect(throws: SPAKE2.Failure.confirmationMismatch) { try b.verify(peerConfirmation: cA) }
    }

    /// The identities and the additional data are what ties the exchange to one TLS channel:
    /// a man in the middle who relays the shares between two channels changes them.
    @Test(arguments: [
        ([1] as [UInt8], [2] as [UInt8], [7] as [UInt8]),
        ([1], [3], []),
        ([4], [2], []),
    ])
    func differentBindingFailsConfirmation(identityA: [UInt8], identityB: [UInt8], additionalData: [UInt8]) throws {
        let w = SPAKE2.passwordScalar(Array("000000".utf8), domain: domain)
        var a = try SPAKE2(role: .a, w: w, identityA: [1], identityB: [2])
        var b = try SPAKE2(role: .b, w: w, identityA: identityA, identityB: identityB)
        let pA = try a.start(), pB = try b.start()
        let cA = try a.finish(peerShare: pB)
        _ = try b.finish(peerShare: pA, additionalData: additionalData)
        #expect(throws: SPAKE2.Failure.confirmationMismatch) { try b.verify(peerConfirmation: cA) }
    }

    @Test func invalidSharesAreRefused() throws {
        let w = SPAKE2.passwordScalar(Array("1".utf8), domain: domain)
        var junk = [UInt8](repeating: 0, count: 65)
        junk[0] = 4
        var notOnCurve = hex("0406557e482bd03097ad0cbaa5df82115460d951e3451962f1eaf4367a420676d09857ccbc522686c83d1852abfa8ed6e4a1155cf8f1543ceca528afb591a1e0b7")
        notOnCurve[64] ^= 1
        for share in [junk, notOnCurve, [], [UInt8](repeating: 4, count: 64), [UInt8](repeating: 0xff, count: 65)] {
            var a = try SPAKE2(role: .a, w: w, identityA: [], identityB: [])
            _ = try a.start()
            #expect(throws: SPAKE2.Failure.invalidShare) { try a.finish(peerShare: share) }
        }
        // The peer echoing our own share back (a reflection) is refused too.
        var a = try SPAKE2(role: .a, w: w, identityA: [], identityB: [])
        let own = try a.start()
        #expect(throws: SPAKE2.Failure.invalidShare) { try a.finish(peerShare: own) }
    }

    @Test func sharesAreFreshEachRun() throws {
        let w = SPAKE2.passwordScalar(Array("123456".utf8), domain: domain)
        var one = try SPAKE2(role: .a, w: w, identityA: [], identityB: [])
        var two = try SPAKE2(role: .a, w: w, identityA: [], identityB: [])
        #expect(try one.start() != two.start())
    }

    @Test func outOfOrderCallsAreRefused() throws {
        let w = SPAKE2.passwordScalar(Array("1".utf8), domain: domain)
        var a = try SPAKE2(role: .a, w: w, identityA: [], identityB: [])
        #expect(throws: SPAKE2.Failure.misuse) { try a.finish(peerShare: [UInt8](repeating: 4, count: 65)) }
        #expect(throws: SPAKE2.Failure.misuse) { try a.verify(peerConfirmation: []) }
    }
}

/// Bytes from a hex literal of the tests (a typo in one is a bug in the test: trap).
func hex(_ text: String) -> [UInt8] {
    precondition(text.count % 2 == 0, "odd hex literal")
    return stride(from: 0, to: text.count, by: 2).map {
        let start = text.index(text.startIndex, offsetBy: $0)
        return UInt8(text[start..<text.index(start, offsetBy: 2)], radix: 16)!
    }
}
