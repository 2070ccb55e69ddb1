import ArgumentParser
import FoundationEssentials
import Glibc
import QXfer

struct IdentityCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "id",
        abstract: "Show this host's identity fingerprint, creating the identity on first run.",
        discussion: """
            EXAMPLES:
              qxfer id                       # the SHA-256 fingerprint peers pin
              qxfer id --json
              qxfer id --config-dir /etc/qxfer

            The identity is host-key.pem and host-cert.pem in the configuration folder; a \
            damaged one is an error, never replaced (docs/COMMANDS.md).
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
