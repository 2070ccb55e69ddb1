import ArgumentParser
import FoundationEssentials
import Glibc
import QXfer

struct IdentityCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "id",
        abstract: "Show this host's identity fingerprint, creating the identity on first run.",
        discussion: """
            The identity is a P-256 key and a self-signed certificate in the configuration \
            folder (host-key.pem, host-cert.pem; files 0600, folder 0700). Peers pin the \
            SHA-256 fingerprint of the certificate printed here. A damaged identity is an \
            error, never silently replaced: replacing it would change the fingerprint every \
            peer has pinned.
            """
    )

    @OptionGroup var global: LocalOptions

    @Flag(help: "Print JSON: fingerprint, folder and whether it was just created.")
    var json = false

    func run() async throws {
        global.bootstrapLogging()
        let directory = global.config
        let existed = HostIdentity.exists(in: directory)
        let identity = try global.identity()
        if json {
            Console.emit("identity", ["fingerprint": identity.fingerprint.description, "directory": directory.path, "created": !existed])
        } else {
            if !existed {
                StandardStream.error.write("qxfer: created a new identity in \(directory.path)\n")
            }
            StandardStream.output.write("\(identity.fingerprint)\n")
        }
    }
}
