import Foundation
import Glibc

/// Remembers, outside the container, the newest store generation this machine has seen for each
/// container, so a store replaced by an older copy of itself (rollback) is noticed at mount.
/// The attacker of the threat model controls the container, not the user's state directory.
public struct GenerationLedger: Sendable {
    public let directory: String

    public init(directory: String = GenerationLedger.defaultDirectory()) { self.directory = directory }

    /// `$COFFER_STATE_DIR`, else `$XDG_STATE_HOME/coffer`, else `~/.local/state/coffer`.
    /// `environment`: another process's (copy and info find a daemon's control socket by it).
    public static func defaultDirectory(environment env: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let d = env["COFFER_STATE_DIR"], !d.isEmpty { return d }
        if let x = env["XDG_STATE_HOME"], x.hasPrefix("/") { return x + "/coffer" }
        let home = env["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return home + "/.local/state/coffer"
    }

    private func path(_ containerId: String) -> String { directory + "/\(containerId).generation" }

    public func lastSeen(containerId: String) -> UInt64? {
        guard let text = try? String(contentsOfFile: path(containerId), encoding: .utf8) else { return nil }
        return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Records `generation` if it is newer than what is recorded. Failures are returned, not thrown:
    /// a read-only home must not stop a mount, but the caller should say so once.
    @discardableResult
    public func record(_ generation: UInt64, containerId: String, replacingNewer: Bool = false) -> Bool {
        if !replacingNewer, let last = lastSeen(containerId: containerId), last >= generation { return true }
        guard
            (try? FileManager.default.createDirectory(
                atPath: directory, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])) != nil
        else { return false }
        let target = path(containerId), tmp = target + ".tmp.\(getpid())"
        guard FileManager.default.createFile(atPath: tmp, contents: Data("\(generation)\n".utf8), attributes: [.posixPermissions: 0o600]) else {
            return false
        }
        guard rename(tmp, target) == 0 else {
            unlink(tmp)
            return false
        }
        return true
    }
}
