/// The IP layer's options.
public struct IP: Sendable, Hashable {
    /// Whether IP may fragment packets (`IP_MTU_DISCOVER`); nil leaves the system default.
    public var allowsFragmentation: Bool?

    public init() {}

    /// Lets the network fragment packets (`true`), or sets Don't Fragment and uses path MTU
    /// discovery (`false`).
    public func fragmentationEnabled(_ enabled: Bool) -> IP {
        var copy = self
        copy.allowsFragmentation = enabled
        return copy
    }
}

