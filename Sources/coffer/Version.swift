import ArgumentParser
import CofferStore

/// The program's version: this is the one place it is written. Printed with the container format
/// version it writes, so a report says both.
enum CofferVersion {
    static let program = "0.9.0"

    static var text: String {
        "coffer \(program) (writes container format \(ContainerHeader.formatName) version \(ContainerHeader.currentVersion))"
    }

    /// `--version` and `-V` as the only argument mean `coffer version`.
    static let flags: Set<String> = ["--version", "-V"]
}

struct VersionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "version", abstract: "Print the version and the container format version it writes (also --version, -V).")

    func run() { print(CofferVersion.text) }
}
