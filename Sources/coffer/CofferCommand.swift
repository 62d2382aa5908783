import ArgumentParser
import CofferStore
import Foundation

struct CofferCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer",
        abstract: "Coffer: an encrypted document filesystem.",
        discussion: """
            A container is a directory holding an encrypted entity store. `coffer mount` shows it as a \
            directory of plain files. Also usable as `mount -t fuse.coffer CONTAINER DIR -o passfile=FILE` \
            (mount(8) runs `coffer CONTAINER DIR -o OPTIONS`).

            Exit statuses: 0 ok, 1 failure, 10 no container, 11 header refused, 12 wrong password, \
            13 store damaged, 14 bad mountpoint, 15 already mounted, 16 mount failed, 17 bad password input, \
            18 store older than last seen (rollback), 19 cannot connect to the PostgreSQL server, 64 usage error. `coffer fsck` has its own, as fsck(8) \
            (see `coffer fsck --help`).
            """,
        subcommands: [
            InitCommand.self, InfoCommand.self, PasswdCommand.self, MountCommand.self, UnmountCommand.self,
            FsckCommand.self, CopyCommand.self, VersionCommand.self
        ])

    static var subcommandNames: Set<String> {
        Set(configuration.subcommands.flatMap { [$0.configuration.commandName].compactMap { $0 } + $0.configuration.aliases })
            .union(["help", "--help", "-h"])
    }
}

/// One failure the user reads: a line on stderr and its own exit status.
struct CLIFailure: Error, CustomStringConvertible {
    let message: String
    let code: Int32
    var description: String { message }

    static func from(_ error: any Error) -> CLIFailure {
        if let e = error as? CLIFailure { return e }
        if let e = error as? ContainerError {
            switch e {
            case .notFound, .notADirectory, .unreadable, .notAContainer, .alreadyExists, .unfinishedCopy:
                return CLIFailure(message: e.description, code: ExitStatus.noContainer)
            case .unreachable: return CLIFailure(message: e.description, code: ExitStatus.serverUnreachable)
            case .badURI: return CLIFailure(message: e.description, code: ExitStatus.usage)
            case .wrongSecret, .noMatchingSlot: return CLIFailure(message: e.description, code: ExitStatus.wrongPassword)
            case .headerDamaged, .headerTampered, .unsupportedVersion, .unsupportedCipher, .unsupportedFeature, .weakKDF, .kdfOutOfRange:
                return CLIFailure(message: e.description, code: ExitStatus.headerRefused)
            default: return CLIFailure(message: e.description, code: ExitStatus.failure)
            }
        }
        if let e = error as? StoreError {
            // A server gone is not a damaged store: the user retries, not repairs.
            if case .unavailable = e { return CLIFailure(message: e.description, code: ExitStatus.serverUnreachable) }
            return CLIFailure(message: e.description, code: ExitStatus.storeDamaged)
        }
        return CLIFailure(message: "\(error)", code: ExitStatus.failure)
    }
}

enum ExitStatus {
    static let failure: Int32 = 1
    static let noContainer: Int32 = 10
    static let headerRefused: Int32 = 11
    static let wrongPassword: Int32 = 12
    static let storeDamaged: Int32 = 13
    static let badMountpoint: Int32 = 14
    static let alreadyMounted: Int32 = 15
    static let mountFailed: Int32 = 16
    static let badPasswordInput: Int32 = 17
    static let rollback: Int32 = 18
    static let serverUnreachable: Int32 = 19
    static let usage: Int32 = 64
}

/// Runs a command body, turning any failure into one clear line and its exit status.
func reportingFailures(_ body: () throws -> Void) throws {
    do { try body() } catch let e as ExitCode { throw e } catch let e as CleanExit { throw e } catch {
        let failure = CLIFailure.from(error)
        FileHandle.standardError.write(Data("coffer: \(failure.message)\n".utf8))
        throw ExitCode(failure.code)
    }
}

func printErr(_ s: String) { FileHandle.standardError.write(Data((s + "\n").utf8)) }
