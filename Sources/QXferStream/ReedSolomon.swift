/// Systematic Reed–Solomon erasure code over GF(2⁸) with a Cauchy generator matrix.
///
/// `k` data shards and `m` parity shards of equal length: any `k` of the `k + m` rebuild the
/// data. Parity shard `j` is Σᵢ C[j][i]·dataᵢ with C[j][i] = 1 / (xⱼ + yᵢ), xⱼ = k + j, yᵢ = i;
/// every square submatrix of a Cauchy matrix is invertible, which is what makes any `k` shards
/// enough. Pure values, no I/O: tested by erasing shards in memory.
public enum ReedSolomon {
    /// The largest `k + m`: the field has 256 elements and x and y must all differ.
    public static let maximumShards = 256

    /// The parity shards for `data` (all the same length).
    public static func parity(data: [[UInt8]], parityCount m: Int) -> [[UInt8]] {
        let k = data.count
        precondition(k >= 1 && m >= 0 && k + m <= maximumShards, "Reed–Solomon needs 1 <= k and k + m <= 256")
        guard m > 0 else { return [] }
        let length = data[0].count
        precondition(data.allSatisfy { $0.count == length }, "shards must have equal length")
        var parity = [[UInt8]](repeating: [UInt8](repeating: 0, count: length), count: m)
        for j in 0..<m {
            parity[j].withUnsafeMutableBufferPointer { output in
                for i in 0..<k {
                    GaloisField.multiplyAdd(coefficient: cauchy(row: j, column: i, k: k), source: data[i], into: output)
                }
            }
        }
        return parity
    }

    /// Rebuilds the data shards from any `k` shards.
    ///
    /// - Parameters:
    ///   - shards: received shards by index: `0..<k` data, `k..<k+m` parity; equal lengths.
    ///   - k: the number of data shards.
    ///   - m: the number of parity shards.
    /// - Returns: the `k` data shards, or nil if fewer than `k` shards are present.
    public static func reconstruct(shards: [Int: [UInt8]], k: Int, m: Int) -> [[UInt8]]? {
        precondition(k >= 1 && m >= 0 && k + m <= maximumShards)
        let missing = (0..<k).filter { shards[$0] == nil }
        if missing.isEmpty { return (0..<k).map { shards[$0]! } }
        let parityRows = (0..<m).filter { shards[k + $0] != nil }.prefix(missing.count)
        guard parityRows.count == missing.count, let length = shards.values.first?.count,
              shards.values.allSatisfy({ $0.count == length }) else { return nil }

        // syndrome_r = parity_{j_r} − Σ_{known i} C[j_r][i]·dᵢ = Σ_{missing c} C[j_r][c]·d_c
        var syndromes: [[UInt8]] = parityRows.map { shards[k + $0]! }
        for (r, j) in parityRows.enumerated() {
            syndromes[r].withUnsafeMutableBufferPointer { output in
                for i in 0..<k where shards[i] != nil {
                    GaloisField.multiplyAdd(coefficient: cauchy(row: j, column: i, k: k), source: shards[i]!, into: output)
                }
            }
        }
        let e = missing.count
        var matrix = parityRows.map { j in missing.map { cauchy(row: j, column: $0, k: k) } }
        guard let inverse = GaloisField.invert(&matrix, size: e) else { return nil }  // cannot happen for Cauchy
        var result = (0..<k).map { shards[$0] ?? [] }
        for (c, index) in missing.enumerated() {
            var rebuilt = [UInt8](repeating: 0, count: length)
            rebuilt.withUnsafeMutableBufferPointer { output in
                for r in 0..<e { GaloisField.multiplyAdd(coefficient: inverse[c][r], source: syndromes[r], into: output) }
            }
            result[index] = rebuilt
        }
        return result
    }

    static func cauchy(row j: Int, column i: Int, k: Int) -> UInt8 {
        GaloisField.inverse(UInt8(k + j) ^ UInt8(i))
    }
}

/// Arithmetic in GF(2⁸) with the polynomial x⁸ + x⁴ + x³ + x² + 1 (0x11D).
enum GaloisField {
    static let tables: (log: [UInt8], exp: [UInt8]) = {
        var log = [UInt8](repeating: 0, count: 256)
        var exp = [UInt8](repeating: 0, count: 512)
        var x = 1
        for power in 0..<255 {
            exp[power] = UInt8(x)
            log[x] = UInt8(power)
            x <<= 1
            if x & 0x100 != 0 { x ^= 0x11D }
        }
        for power in 255..<512 { exp[power] = exp[power - 255] }
        return (log, exp)
    }()

    /// One 256-byte multiplication row per coefficient: the inner loop is a table lookup.
    static let products: [[UInt8]] = (0..<256).map { a in (0..<256).map { b in multiply(UInt8(a), UInt8(b)) } }

    static func multiply(_ a: UInt8, _ b: UInt8) -> UInt8 {
        if a == 0 || b == 0 { return 0 }
        return tables.exp[Int(tables.log[Int(a)]) + Int(tables.log[Int(b)])]
    }

    static func inverse(_ a: UInt8) -> UInt8 {
        precondition(a != 0, "zero has no inverse")
        return tables.exp[255 - Int(tables.log[Int(a)])]
    }

    /// output ^= coefficient · source, byte by byte.
    static func multiplyAdd(coefficient: UInt8, source: [UInt8], into output: UnsafeMutableBufferPointer<UInt8>) {
        guard coefficient != 0 else { return }
        let count = min(source.count, output.count)
        products[Int(coefficient)].withUnsafeBufferPointer { row in
            source.withUnsafeBufferPointer { input in
                for index in 0..<count { output[index] ^= row[Int(input[index])] }
            }
        }
    }

    /// Inverts a square matrix by Gauss–Jordan elimination; nil if singular.
    static func invert(_ matrix: inout [[UInt8]], size n: Int) -> [[UInt8]]? {
        var inverse = (0..<n).map { row in (0..<n).map { UInt8($0 == row ? 1 : 0) } }
        for column in 0..<n {
            guard let pivot = (column..<n).first(where: { matrix[$0][column] != 0 }) else { return nil }
            matrix.swapAt(column, pivot)
            inverse.swapAt(column, pivot)
            let scale = Self.inverse(matrix[column][column])
            for c in 0..<n {
                matrix[column][c] = multiply(matrix[column][c], scale)
                inverse[column][c] = multiply(inverse[column][c], scale)
            }
            for row in 0..<n where row != column && matrix[row][column] != 0 {
                let factor = matrix[row][column]
                for c in 0..<n {
                    matrix[row][c] ^= multiply(factor, matrix[column][c])
                    inverse[row][c] ^= multiply(factor, inverse[column][c])
                }
            }
        }
        return inverse
    }
}
