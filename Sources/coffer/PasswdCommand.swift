import ArgumentParser
import CofferCrypto
import CofferStore
import Foundation
import Glibc

struct PasswdCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "passwd",
        abstract: "Change the password or manage key slots (rewraps the master key; no data is re-encrypted).",
        discussion: """
            Without an action flag: changes the password of the slot the current secret opens.
            The current secret comes from --passfile/--extpass/--keyfile or a prompt; a new password from
            --new-passfile or a prompt (asked twice).
            """)

    @Argument(help: "The container directory or postgresql:// URI.")
    var container: String

    @OptionGroup var secret: SecretOptions
    @OptionGroup var kdf: KDFOptions

    @Option(help: "Read the new password from the first line of FILE.")
    var newPassfile: String?

    @Flag(help: "Add another password slot instead of changing one.")
    var addPassword = false

    @Option(help: "Add a key file slot: the content of FILE (1 to 4096 bytes) becomes a secret.")
    var addKeyfile: String?

    @Option(help: "Remove the key slot with this id (see `coffer info`). The last slot cannot be removed.")
    var removeSlot: String?

    @Option(help: "Label for a new slot.")
    var label: String?

    func validate() throws {
        let actions = [addPassword, addKeyfile != nil, removeSlot != nil].filter { $0 }.count
        if actions > 1 { throw ValidationError("give at most one of --add-password, --add-keyfile, --remove-slot") }
    }

    func run() throws {
        try reportingFailures {
            let c = try ContainerSource.open(container)
            try secret.checkSource()
            for (path, what) in [(newPassfile, "password file"), (addKeyfile, "key file")] {
                if let path, access(path, R_OK) != 0 { throw SecretReader.fail("cannot read \(what) \(path): \(String(cString: strerror(errno)))") }
            }
            let current = try secret.secret(prompt: "Current password: ")
            let (keys, slotId) = try c.unlock(current)
            current.bytes.wipe()
            defer { keys.wipe() }
            if let id = removeSlot {
                try c.removeSlot(id: id, keys: keys)
                print("Removed key slot \(id).")
            } else if let path = addKeyfile {
                let key = try SecretReader.keyFile(path)
                defer { key.wipe() }
                let id = try c.addSlot(kind: .keyfile, secret: key, kdf: kdf.choice, label: label ?? "key file", keys: keys)
                print("Added key file slot \(id).")
            } else {
                let newPassword = try newSecret()
                defer { newPassword.wipe() }
                if addPassword {
                    let id = try c.addSlot(kind: .password, secret: newPassword, kdf: kdf.choice, label: label ?? "password", keys: keys)
                    print("Added password slot \(id).")
                } else if c.header.slots.first(where: { $0.id == slotId })?.kind == .password {
                    try c.replaceSlot(id: slotId, secret: newPassword, kdf: kdf.choice, keys: keys)
                    print("Password changed (slot \(slotId)).")
                } else {
                    // Opened with a recovery key or key file: that slot stays; the new password gets its own.
                    let id = try c.addSlot(kind: .password, secret: newPassword, kdf: kdf.choice, label: label ?? "password", keys: keys)
                    print("Added password slot \(id) (the slot used to open stays).")
                }
            }
        }
    }

    func newSecret() throws -> SecureBytes {
        if let newPassfile { return try SecretReader.firstLine(ofFile: newPassfile) }
        return try SecretReader.prompt("New password: ", confirm: true)
    }
}
