internal import CP256

/// The P-256 group operations SPAKE2 (RFC 9382) needs, from OpenSSL's libcrypto through CP256:
/// 32-byte big-endian scalars, 65-byte uncompressed points (SEC1). Every point from the network
/// is decoded with a full on-curve check; a failure (bad encoding, point off the curve, identity
/// result) is nil, never a trap.
public enum P256Group {
    /// Bytes of a scalar.
    public static let scalarBytes = Int(CP256_SCALAR_BYTES)
    /// Bytes of an uncompressed point.
    public static let pointBytes = Int(CP256_POINT_BYTES)

    /// Whether the arithmetic is there: libcrypto is loaded on first use (this call loads it),
    /// and every operation fails (nil) on a machine without it. `cp256_available`.
    public static var isAvailable: Bool { cp256_available() == 1 }

    /// A uniformly random scalar in [1, n). The corresponding C function is `cp256_random_scalar`.
    public static func randomScalar() -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: scalarBytes)
        return cp256_random_scalar(&out) == 1 ? out : nil
    }

    /// A big-endian integer of any length reduced modulo the group order. `cp256_reduce`.
    public static func reduce(_ wide: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: scalarBytes)
        return cp256_reduce(wide, wide.count, &out) == 1 ? out : nil
    }

    /// scalar·G + w·base: a SPAKE2 public share. `cp256_share`.
    public static func share(scalar: [UInt8], w: [UInt8], base: [UInt8]) -> [UInt8]? {
        guard scalar.count == scalarBytes, w.count == scalarBytes, base.count == pointBytes else { return nil }
        var out = [UInt8](repeating: 0, count: pointBytes)
        return cp256_share(scalar, w, base, &out) == 1 ? out : nil
    }

    /// scalar·(peer − w·base): the shared point K; nil if `peer` is not a valid point other than
    /// the identity, or if K is the identity. `cp256_shared_point`.
    public static func sharedPoint(scalar: [UInt8], w: [UInt8], base: [UInt8], peer: [UInt8]) -> [UInt8]? {
        guard scalar.count == scalarBytes, w.count == scalarBytes, base.count == pointBytes, peer.count == pointBytes else {
            return nil
        }
        var out = [UInt8](repeating: 0, count: pointBytes)
        return cp256_shared_point(scalar, w, base, peer, &out) == 1 ? out : nil
    }

    /// The uncompressed form of a compressed (33-byte) or uncompressed point, validated.
    /// `cp256_decompress`.
    public static func decompress(_ point: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: pointBytes)
        return cp256_decompress(point, point.count, &out) == 1 ? out : nil
    }
}
