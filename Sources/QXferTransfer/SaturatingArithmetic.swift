/// Sums and differences of byte counts that came from the network or a file: they stop at the
/// bounds instead of trapping. Used where a bound is a correct answer (a progress total, a
/// count shown to the user); where it is not, the caller checks with `addingReportingOverflow`
/// and refuses the input.
extension UInt64 {
    /// `self + other`, or `UInt64.max` if that does not fit.
    func saturatingAdd(_ other: UInt64) -> UInt64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }

    /// `self - other`, or 0 if `other` is larger.
    func saturatingSubtract(_ other: UInt64) -> UInt64 {
        other > self ? 0 : self - other
    }
}
