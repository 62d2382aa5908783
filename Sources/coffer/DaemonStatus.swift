import CofferStore
import Foundation
import Glibc

/// What a mounted directory container's daemon says of its store (ControlServer's `status`): `coffer info`
/// cannot open a store its daemon holds for itself, so it asks.
struct DaemonStatus: Equatable {
    var generation: UInt64
    var counts: StoreCounts
    /// How the store seals chunks (`blocks=1|0`); nil from a daemon of a version that does not say.
    var chunkSealing: ChunkSealing? = nil

    /// Daemon `pid`'s answer; nil when it has no control socket (an older version).
    static func ask(containerId: String, daemon pid: pid_t) throws -> DaemonStatus? {
        guard let (fd, _) = try ControlSocket.connect(containerId: containerId, daemon: pid) else { return nil }
        defer { close(fd) }
        ControlSocket.setTimeout(fd, seconds: 30)
        ControlSocket.writeLine(fd, "status")
        let answer = ControlSocket.readLine(fd)
        guard let answer, answer.hasPrefix("OK "), let status = parse(String(answer.dropFirst(3))) else {
            let why = answer.map { $0.hasPrefix("ERR ") ? String($0.dropFirst(4)) : "unexpected answer" } ?? "no answer"
            throw CLIFailure(message: "the mount daemon (pid \(pid)) did not tell its store's state: \(why)", code: ExitStatus.failure)
        }
        return status
    }

    /// `generation=N inodes=N entries=N chunks=N xattrs=N [blocks=1|0]`; nil when a field is missing or not a number.
    static func parse(_ text: String) -> DaemonStatus? {
        var fields: [String: UInt64] = [:]
        for pair in text.split(separator: " ") {
            let kv = pair.split(separator: "=", maxSplits: 1)
            guard kv.count == 2, let v = UInt64(kv[1]) else { return nil }
            fields[String(kv[0])] = v
        }
        guard let g = fields["generation"], let i = fields["inodes"], let e = fields["entries"], let c = fields["chunks"],
            let x = fields["xattrs"]
        else { return nil }
        var counts = StoreCounts()
        counts.inodes = Int(clamping: i)
        counts.entries = Int(clamping: e)
        counts.chunks = Int(clamping: c)
        counts.xattrs = Int(clamping: x)
        return DaemonStatus(generation: g, counts: counts, chunkSealing: fields["blocks"].map { $0 == 1 ? .blocks : .whole })
    }
}
