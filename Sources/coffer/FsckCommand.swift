import ArgumentParser
import CofferCheck
import CofferStore
import Foundation
import Glibc

/// `coffer fsck`: checks (and with --repair repairs) an unmounted container offline. Exit statuses
/// follow fsck(8), so they differ from the other commands'.
struct FsckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fsck",
        abstract: "Check a container (unmounted) and optionally repair it.",
        discussion: """
            Opens and authenticates the header and every entity (inodes, directory entries, xattrs, chunk map pages, content chunks), compares every file's chunks with its chunk map, and walks the tree from the root (unreachable inodes, cycles, entries pointing nowhere, link counts). Each problem is reported with its path when the tree gives one. Refuses a mounted container and holds the container's lock while it runs.

            --repair (asks on a terminal unless --yes) links unreachable files and files that lost chunks into /lost+found, turns missing or damaged chunks into holes (the report lists the bytes lost), fixes link and chunk counts, rewrites chunk maps, and drops unreferenced chunks and map pages, entries that point nowhere or fail authentication, and inodes that fail authentication. One transaction: an interrupted repair changes nothing.

            Exit statuses (as fsck(8)):
              0   no problems
              1   problems found and all repaired
              4   problems left unrepaired
              8   operational error (no container, wrong password, damaged header, mounted)
              16  usage error
              32  cancelled by the user
            """)

    @Argument(help: "The container directory or postgresql:// URI.")
    var container: String

    @OptionGroup var secret: SecretOptions

    @Flag(help: "Repair what can be repaired (asks for confirmation on a terminal).")
    var repair = false

    @Flag(name: [.customShort("y"), .customLong("yes")], help: "Repair without asking.")
    var yes = false

    @Flag(help: "Print one JSON document on stdout (problems, counts, repairs) for scripts.")
    var json = false

    enum Status {
        static let clean: Int32 = 0
        static let repaired: Int32 = 1
        static let unrepaired: Int32 = 4
        static let operational: Int32 = 8
        static let usage: Int32 = 16
        static let cancelled: Int32 = 32
    }

    func validate() throws {
        if yes && !repair { throw ValidationError("--yes only goes with --repair") }
    }

    func run() throws {
        var report = Report(container: container)
        let code = execute(&report)
        report.status = code
        if json { print(report.jsonText()) }
        if code != 0 { throw ExitCode(code) }
    }

    /// Runs the check (and repair); returns the exit status. Failures print one line on stderr.
    private func execute(_ report: inout Report) -> Int32 {
        let c: Container
        let lock: ContainerClaim
        do {
            c = try ContainerSource.open(container)
            report.container = c.root
            do { lock = try ContainerClaim.take(c, purpose: "fsck") } catch let f as CLIFailure where f.code == ExitStatus.alreadyMounted {
                return fail("container is mounted (\(ContainerClaim.holder(c) ?? "pid ?")) — unmount it first", &report)
            }
        } catch { return fail(CLIFailure.from(error).message, &report) }
        defer { lock.release() }
        return withExtendedLifetime(lock) { () -> Int32 in
            let keys: ContainerKeys
            do { keys = try secret.unlock(c).keys } catch { return fail(CLIFailure.from(error).message, &report) }
            defer { keys.wipe() }
            return checkAndRepair(c, keys: keys, leaseHolder: lock.lease?.me.holder, &report)
        }
    }

    /// `leaseHolder`: a PostgreSQL container's repair commits only while fsck still holds its lease.
    private func checkAndRepair(_ c: Container, keys: ContainerKeys, leaseHolder: String?, _ report: inout Report) -> Int32 {
        let result: CheckResult
        do {
            result = try check(c, keys: keys)
        } catch StoreError.damagedFile(let why) {
            result = Checker.unopenable(why)  // reported as a problem, not as fsck failing to run
        } catch { return fail(CLIFailure.from(error).message, &report) }
        report.found = result
        if !json { printProblems(result, heading: "coffer fsck \(c.root)") }
        if result.isClean { return Status.clean }
        guard repair else { return Status.unrepaired }
        guard result.problems.contains(where: \.isRepairable) else {
            printErr("coffer fsck: not repairing: nothing found here can be repaired; nothing was changed")
            return Status.unrepaired
        }
        guard !result.problems.contains(where: { $0.kind == .storeFileDamaged }) else {
            printErr("coffer fsck: not repairing: SQLite finds the store file damaged, and writing to it could make that worse; nothing was changed")
            return Status.unrepaired
        }
        if !yes {
            guard isatty(STDIN_FILENO) != 0 else {
                printErr("coffer fsck: not repairing: there is no terminal to confirm on; pass --yes to repair without asking")
                return Status.unrepaired
            }
            guard confirm(result) else {
                printErr("coffer fsck: cancelled; nothing was changed")
                return Status.cancelled
            }
        }
        let after: CheckResult
        do {
            // Checked again after each pass: a repair can bring out damage the check before it could not see.
            let (summary, left) = try Repairer.repairInPasses(
                result, open: { try c.openStore(keys: keys, readOnly: false, leaseHolder: leaseHolder, foreign: .repair) },
                check: { try check(c, keys: keys) })
            report.summary = summary
            after = left
        } catch {
            report.summary = error.done
            printRepaired(report.summary)
            let what = error.inCheck ? "the check after a repair pass failed" : "a repair pass failed and was rolled back"
            return fail("\(what): \(CLIFailure.from(error.error).message)", &report)
        }
        printRepaired(report.summary)
        report.remaining = after
        if after.isClean { return Status.repaired }
        if !json { printProblems(after, heading: "Left after the repair:") }
        return Status.unrepaired
    }

    private func printRepaired(_ summary: RepairSummary?) {
        guard !json, let summary, !summary.actions.isEmpty else { return }
        print("Repaired:")
        for line in summary.actions { print("  \(line)") }
    }

    private func check(_ c: Container, keys: ContainerKeys) throws -> CheckResult {
        let chunkSize = c.header.chunkSize
        let store = try c.openStore(keys: keys, readOnly: true, foreign: .tolerate)
        defer { store.close() }
        let bar = ProgressBar("checking")
        defer { bar.finish() }
        return try Checker(store: store, chunkSize: chunkSize, progress: { bar.update(done: $0, total: $1) }).run()
    }

    private func printProblems(_ result: CheckResult, heading: String) {
        print(heading)
        for p in result.problems {
            print("  \(p.kind.rawValue): \(p.location): \(p.detail)")
            if repair { print("      repair: \(p.repair)") }
        }
        let n = result.counts
        print(
            "\(result.problems.count) problem(s); checked \(n.inodes) inodes (\(n.directories) directories, \(n.files) others), \(n.entries) entries, \(n.chunks) chunks, \(n.chunkMapPages) map pages, \(n.xattrs) xattrs"
        )
    }

    /// Lists what the repair will do and asks on the terminal.
    private func confirm(_ result: CheckResult) -> Bool {
        printErr("The repair will:")
        for p in result.problems { printErr("  \(p.location): \(p.repair)") }
        FileHandle.standardError.write(Data("Repair \(result.problems.count) problem(s)? [y/N] ".utf8))
        guard let answer = readLine(strippingNewline: true)?.trimmingCharacters(in: .whitespaces).lowercased() else { return false }
        return answer == "y" || answer == "yes"
    }

    private func fail(_ message: String, _ report: inout Report) -> Int32 {
        printErr("coffer fsck: \(message)")
        report.error = message
        return Status.operational
    }

    /// Parse errors of `coffer fsck` exit with fsck(8)'s usage status instead of the usual 64.
    static func main(mappingUsageErrors arguments: [String]) -> Never {
        do {
            var command = try CofferCommand.parseAsRoot(arguments)
            try command.run()
            CofferCommand.exit()
        } catch {
            if CofferCommand.exitCode(for: error) == .validationFailure {
                printErr(CofferCommand.fullMessage(for: error))
                Glibc.exit(Status.usage)
            }
            CofferCommand.exit(withError: error)
        }
    }
}

/// What `--json` prints: the problems found, the repair, and what was left.
struct Report {
    var container: String
    var status: Int32 = 0
    var error: String?
    var found: CheckResult?
    var summary: RepairSummary?
    var remaining: CheckResult?

    func jsonText() -> String {
        var doc: [String: Any] = ["container": container, "status": Int(status)]
        if let error { doc["error"] = error }
        if let found {
            doc["problems"] = found.problems.map(Self.problem)
            let n = found.counts
            doc["counts"] = [
                "inodes": n.inodes, "directories": n.directories, "files": n.files, "entries": n.entries,
                "chunks": n.chunks, "chunkMapPages": n.chunkMapPages, "xattrs": n.xattrs, "problems": found.problems.count
            ]
        }
        if let summary {
            doc["repaired"] = summary.actions
            doc["lostRanges"] = summary.lostRanges.map { r -> [String: Any] in
                [
                    "path": r.path ?? NSNull(), "inode": NSNumber(value: r.inode),
                    "ranges": r.ranges.map { [NSNumber(value: $0.lowerBound), NSNumber(value: $0.upperBound)] }
                ]
            }
        }
        if let remaining { doc["remaining"] = remaining.problems.map(Self.problem) }
        guard let data = try? JSONSerialization.data(withJSONObject: doc, options: [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]) else {
            return "{\"status\": \(status), \"error\": \"cannot encode the report\"}"
        }
        return String(decoding: data, as: UTF8.self)
    }

    static func problem(_ p: Problem) -> [String: Any] {
        [
            "kind": p.kind.rawValue, "path": p.path ?? NSNull(), "inode": p.inode.map { NSNumber(value: $0) } ?? NSNull(),
            "detail": p.detail, "repair": p.repair
        ]
    }
}
