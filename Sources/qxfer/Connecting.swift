import FoundationEssentials
import Glibc
import Logging
import QXfer
import LinuxSystem
import ArgumentParser

/// Starts `connection` as a command-line user expects: a refused TCP connection (nothing
/// listens on that port), a network the kernel has no route to or a name that does not resolve
/// fails within `grace`, as scp and ssh say so at once, instead of being retried until the 10 s
/// connect timeout as the library's `waiting` state does for failures that may pass. The grace
/// (the library's first three attempts, 0.75 s) covers a receiver started a moment before its
/// sender, as scripts do. A transfer's own reconnect loop still retries such failures after the
/// receiver accepted.
/// `onRefusal` hears the refusal before the connection is cancelled, so that another task using
/// the connection, which then fails as cancelled, can say why.
func startFailingFast<Stack>(
    _ connection: NetworkConnection<Stack>, grace: Duration = .milliseconds(500), onRefusal: @escaping @Sendable (QXferError) -> Void = { _ in }
) async throws {
    let definitive = [ECONNREFUSED, ENETUNREACH, EHOSTUNREACH].map { String(cString: strerror($0)) }
    let started = ContinuousClock.now
    // The refusal, kept before the connection is cancelled: the start then fails as cancelled,
    // and whichever task ends first, the refusal is what the caller hears.
    let refusal = Locked<QXferError?>(nil)
    // true: started; false: the state watcher ended without finding a refusal.
    try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask {
            do {
                try await connection.start()
            } catch {
                throw refusal.withLock { $0 } ?? error
            }
            return true
        }
        group.addTask {
            for await state in connection.states {
                guard case .waiting(let error) = state else { continue }
                Logger(label: "qxfer.connect").info("attempt failed, retrying: \(error.message)")
                // A race (`--stack auto`) says "nothing listens" once every stack refused or stayed silent.
                let refused = definitive.contains(where: error.message.hasSuffix) || error.underlying is NothingListens
                    || error.underlying is NameDoesNotResolve
                if refused, ContinuousClock.now - started >= grace {
                    refusal.withLock { $0 = error }
                    onRefusal(error)
                    connection.cancel()
                    throw error
                }
            }
            return false
        }
        for try await started in group where started {
            group.cancelAll()
            return
        }
    }
}

/// What a command says before it connects again after ``EarlyDataUnanswered`` (nil for any
/// other error). QUIC sent early and its address stayed silent or refused (UDP blocked since the
/// last connection, a dual-stack name whose other family works); that attempt's ticket is
/// dropped, so the next connection sends nothing early and races the name's addresses and,
/// under `--stack auto` (`racing`), the stacks.
func earlyDataRetryNote(_ error: any Error, to endpoint: Endpoint, racing: Bool) -> String? {
    guard let failure = error as? QXferError, let unanswered = failure.underlying as? EarlyDataUnanswered else { return nil }
    let next = racing ? "racing QUIC and TCP+TLS" : "connecting again without early data"
    return "\(unanswered.stack) with early data could not reach \(endpoint) (\(failure.message)); \(next)"
}

/// `text` as the place a command connects to (`HOST`, `HOST:PORT`, `[IPV6]:PORT`, with
/// `defaultPort` when none is given), or a usage error that says what is wrong with it.
func parseDestination(_ text: String, defaultPort: UInt16) throws(ValidationError) -> Endpoint {
    if let endpoint = Endpoint(parsing: text, defaultPort: defaultPort) { return endpoint }
    // The port, where the text has one: after "]:" or after a single ':'.
    var port: Substring?
    if text.hasPrefix("["), let close = text.firstIndex(of: "]"), text[close...].hasPrefix("]:") {
        port = text[text.index(close, offsetBy: 2)...]
    } else if !text.hasPrefix("["), text.filter({ $0 == ":" }).count == 1 {
        port = text.split(separator: ":", omittingEmptySubsequences: false)[1]
    }
    switch port.map({ UInt16($0) }) {
    case 0?: throw ValidationError("'\(text)': port 0 is no port to connect to; give the one the receiver listens on")
    case nil?: throw ValidationError("'\(text)': the port must be a number from 1 to 65535")
    default: break
    }
    throw ValidationError("'\(text)' is not a host, host:port or [ipv6]:port")
}
