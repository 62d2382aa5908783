import CofferStore
import Foundation
import Glibc
import Logging

/// What the user typed as a container: a directory or a `postgresql://` URI (ContainerLocation).
/// A URI that carries the database password is refused: it would sit in argv (ps, the daemon's command
/// line, shell history); libpq's own sources (~/.pgpass, PGPASSFILE, a service file, `passfile=`) serve.
enum ContainerSource {
    static func location(_ text: String) throws -> ContainerLocation {
        let location = try ContainerLocation.parse(text)
        if case .postgres(let p) = location, p.carriesPassword {
            throw CLIFailure(
                message:
                    "\(p.display): the URI carries the database password; put it in ~/.pgpass (or PGPASSFILE, a service file, or passfile= in the URI) instead, so it never shows in argv or logs",
                code: ExitStatus.usage)
        }
        return location
    }

    static func open(_ text: String) throws -> Container { try Container.open(try location(text)) }

    /// What a mount's argv and messages carry: an absolute path, or the URI as given (no password).
    static func argument(_ text: String) -> String { ContainerURI.isURI(text) ? text : Container.absolutePath(text) }
}

/// A directory container's one mount (or fsck): its flock (ContainerLock). A PostgreSQL container's
/// mount or fsck: a lease row (PostgresLease) that the daemon renews while it runs; any number of
/// mounts share such a container, an fsck takes it alone.
final class ContainerClaim: @unchecked Sendable {
    private let lock: ContainerLock?
    let lease: PostgresLease?
    private var renewer: Thread?
    private let stopped = NSCondition()
    private var stopping = false

    private init(lock: ContainerLock?, lease: PostgresLease?) {
        self.lock = lock
        self.lease = lease
    }

    /// Takes the container for `purpose` ("mount", "fsck"); exit 15 naming the holder that keeps it out.
    static func take(_ c: Container, purpose: String) throws -> ContainerClaim {
        switch c.location {
        case .directory:
            ContainerLock.awaitDaemonWithoutMount(root: c.root)
            return ContainerClaim(lock: try ContainerLock(root: c.root), lease: nil)
        case .postgres(let p):
            do {
                return ContainerClaim(lock: nil, lease: try PostgresLease.take(p, purpose: purpose, machine: machineId))
            } catch PostgresLease.Failure.held(let h) { throw alreadyMounted(c, h, purpose: purpose) } catch {
                // The header was read a moment ago: a server gone since is status 19, as at the header.
                let gone = if case PostgresLease.Failure.unavailable = error { true } else { false }
                throw CLIFailure(message: "\(p.display): \(error)", code: gone ? ExitStatus.serverUnreachable : ExitStatus.failure)
            }
        }
    }

    /// Who holds the container now ("pid N", "pid N on HOST (mount)"), nil when nobody.
    static func holder(_ c: Container) -> String? {
        switch c.location {
        case .directory: return ContainerLock.holder(root: c.root).map { "pid \($0 > 0 ? String($0) : "?")" }
        case .postgres(let p):
            let holders = PostgresLease.holders(p)
            return holders.isEmpty ? nil : holders.map(\.description).joined(separator: ", ")
        }
    }

    /// Refuses a mount (exit 15) when the container is held: a directory by any mount (its finishing
    /// daemon is waited for first), a PostgreSQL container by an fsck.
    static func checkFree(_ c: Container) throws {
        switch c.location {
        case .directory:
            ContainerLock.awaitDaemonWithoutMount(root: c.root)
            if ContainerLock.holder(root: c.root) != nil { throw ContainerLock.alreadyMounted(root: c.root) }
        case .postgres(let p):
            if let h = PostgresLease.excluding(p, purpose: "mount", machine: machineId) { throw alreadyMounted(c, h, purpose: "mount") }
        }
    }

    static func alreadyMounted(_ c: Container, _ h: PostgresLease.Holder, purpose: String) -> CLIFailure {
        let rule = purpose == "fsck" ? "fsck runs only while nothing else uses the container" : "no mount while an fsck runs"
        return CLIFailure(
            message:
                "the container \(c.root) is already in use: held by \(h) (\(rule); a holder that is gone lets its lease lapse within \(PostgresLease.duration) s)",
            code: ExitStatus.alreadyMounted)
    }

    static var machineId: String { PostgresLease.machineId(stateDirectory: GenerationLedger.defaultDirectory()) }

    /// Renews the lease every `PostgresLease.renewEvery` seconds until `release`. A server that cannot
    /// be reached is retried (the lease outlives three missed renewals); a lease that lapsed while an fsck took
    /// the container (this mount was cut off longer than the lease) calls `lost`: the mount must end.
    func startRenewing(logger: Logger, lost: @escaping @Sendable (String) -> Void) {
        guard let lease else { return }
        let t = Thread { [self] in
            var failing = false
            // While renewals fail, retry every second: a server back after a 20 s restart must not
            // find the lease lapsed because the next try was 7.5 s away.
            while !waitStop(failing ? 1 : PostgresLease.renewEvery) {
                do {
                    try lease.renew()
                    if failing { logger.notice("the container's lease is renewed again") }
                    failing = false
                } catch PostgresLease.Failure.held(let h) {
                    lost("the container was taken (\(h)) while this mount could not reach the server")
                    return
                } catch {
                    if !failing { logger.warning("cannot renew the container's lease: \(error)") }
                    failing = true
                }
            }
        }
        t.name = "coffer-lease"
        renewer = t
        t.start()
    }

    /// Waits on the monotonic clock (a wall clock stepped back must not delay a renewal).
    private func waitStop(_ seconds: Double) -> Bool {
        stopped.lock()
        defer { stopped.unlock() }
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while !stopping, ContinuousClock.now < deadline {
            // Short real-time waits, each checked against the monotonic deadline.
            _ = stopped.wait(until: Date().addingTimeInterval(min(0.25, seconds)))
        }
        return stopping
    }

    /// Ends renewal and gives the container back (the lease row is deleted; the flock closed with us).
    func release() {
        stopped.lock()
        stopping = true
        stopped.broadcast()
        stopped.unlock()
        lease?.release()
    }
}
