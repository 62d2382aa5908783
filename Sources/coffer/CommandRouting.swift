import CofferStore
import Foundation
import Glibc

/// What the first argument means before argument-parser sees it: `--version`/`-V`, and the argv form
/// of mount.fuse3 (`coffer SOURCE MOUNTPOINT -o OPTS` for `mount -t fuse.coffer` and fstab lines),
/// taken only for a SOURCE that is a container, so a mistyped command is not taken for a mount
/// (which would ask for a password for a container called "inof").
enum CommandRouting {
    static func route(_ arguments: [String]) -> [String] {
        guard let first = arguments.first else { return arguments }
        if arguments.count == 1, CofferVersion.flags.contains(first) { return ["version"] }
        guard !first.hasPrefix("-"), !CofferCommand.subcommandNames.contains(first) else { return arguments }
        if isMountSource(first) { return ["mount"] + fromMountHelper(arguments) }
        unknownCommand(first)
    }

    /// The argv of mount.fuse3, with the `suid`/`dev` it adds to every `-o` list dropped (MountOptionSet).
    static func fromMountHelper(_ arguments: [String]) -> [String] {
        var out = arguments
        for i in out.indices.dropLast() where out[i] == "-o" { out[i + 1] = MountOptionSet.fromMountHelper(out[i + 1]) }
        return out
    }

    /// An existing container directory (with its header), or a container URI.
    static func isMountSource(_ source: String) -> Bool {
        if ContainerURI.isURI(source) { return true }
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: source, isDirectory: &isDirectory) && isDirectory.boolValue
            && access(source + "/" + ContainerHeader.fileName, F_OK) == 0
    }

    static func unknownCommand(_ word: String) -> Never {
        var text = "coffer: unknown command \"\(word)\""
        if word.contains("/") { text += " (and \(word) is not a Coffer container to mount)" }
        text += "\n\nCommands:\n"
        for c in CofferCommand.configuration.subcommands {
            let name = c.configuration.commandName ?? ""
            text += "  " + name.padding(toLength: 9, withPad: " ", startingAt: 0) + c.configuration.abstract + "\n"
        }
        text += "\nSee `coffer help COMMAND`. mount(8) runs `coffer CONTAINER MOUNTPOINT -o OPTIONS`.\n"
        FileHandle.standardError.write(Data(text.utf8))
        exit(ExitStatus.usage)
    }
}

/// Containers named by a URI: a schema in a PostgreSQL database (ContainerLocation).
enum ContainerURI {
    static let schemes = ["postgresql://", "postgres://"]

    static func isURI(_ s: String) -> Bool { schemes.contains { s.hasPrefix($0) } }
}
