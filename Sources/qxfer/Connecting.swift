import Foundation
import Logging
import QXfer

/// Starts `connection` as a command-line user expects: a refused TCP connection (nothing
/// listens on that port) or a network the kernel has no route to fails at once, as scp and ssh
/// say so, instead of being retried until the connect timeout as the library's `waiting` state
/// does for failures that may pass. A transfer's own reconnect loop still retries them after
/// the receiver accepted.
func startFailingFast<Stack>(_ connection: NetworkConnection<Stack>) async throws {
    let definitive = [ECONNREFUSED, ENETUNREACH, EHOSTUNREACH].map { String(cString: strerror($0)) }
    // true: started; false: the state watcher ended without finding a refusal.
    try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask {
            try await connection.start()
            return true
        }
        group.addTask {
            for await state in connection.states {
                guard case .waiting(let error) = state else { continue }
                Logger(label: "qxfer.connect").info("attempt failed, retrying: \(error.message)")
                if definitive.contains(where: error.message.hasSuffix) {
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
