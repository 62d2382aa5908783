import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 15, item 7: the containers under Tests/Fixtures (format-1; format-1-blocks, chunks sealed in 4 KiB
// blocks) were made by the code of their day and are never regenerated. Every later version must mount a copy
// of each and show exactly what its manifest lists:
// names, types, modes, owners, sizes, stored blocks, nlink, mtimes to the nanosecond, symlink targets
// (the absolute one under this mount's path), user.* xattrs, and the content's SHA-256.

@Suite("Format fixtures through a real mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct FormatFixtureTests {
    @Test(arguments: FormatFixture.all)
    func fixtureMountsAndReadsAsItsManifestSays(fixture: String) throws {
        let sb = try Sandbox("fixture1")
        defer { sb.cleanup() }
        try FormatFixture.copyContainer(fixture, to: sb.container)
        try E2E.write(sb.passfile, try FormatFixture.password(fixture) + "\n")
        let manifest = try FormatFixture.manifest(fixture)
        #expect(manifest.format == 1 && manifest.chunkSize == 32768)

        var env = ProcessInfo.processInfo.environment
        env["COFFER_STATE_DIR"] = sb.root + "/state"
        let m = E2E.run(E2E.coffer, ["mount", sb.container, sb.mnt, "--passfile", sb.passfile], environment: env)
        sb.noteDaemon()
        try #require(m.ok, "the \(fixture) fixture must mount: \(m)")
        defer { E2E.run(E2E.coffer, ["unmount", sb.mnt], environment: env) }

        let seen = try Self.walk(sb.mnt)
        let differences = FormatFixture.differences(expected: manifest.entries, seen: seen)
        #expect(differences.isEmpty, "the mount differs from the manifest:\n\(differences.joined(separator: "\n"))")
        // The hard link is one file: both names have the same inode.
        let a = try #require(E2E.lstatOf(sb.mnt + "/hardlink-a")), b = try #require(E2E.lstatOf(sb.mnt + "/notes/hardlink-b"))
        #expect(a.st_ino == b.st_ino, "hardlink-a and notes/hardlink-b are different inodes")
        // The absolute symlink leads to the file under this mountpoint.
        #expect(E2E.read(sb.mnt + "/notes/deep/link-abs") == E2E.read(sb.mnt + "/hello.txt"))

        // Written to by today's code, each store keeps its form (format-1 seals chunks whole): parts of chunks
        // overwritten and a file grown read back after a remount, and fsck finds nothing.
        var sparse = try #require(E2E.read(sb.mnt + "/sparse.bin"))
        let patch = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        let fd = open(sb.mnt + "/sparse.bin", O_WRONLY)
        try #require(fd >= 0)
        #expect(pwrite(fd, patch, patch.count, 40_000) == patch.count)
        #expect(pwrite(fd, patch, patch.count, off_t(sparse.count)) == patch.count)
        close(fd)
        sparse.replaceSubrange(40_000..<50_000, with: patch)
        sparse += patch
        let u = E2E.run(E2E.coffer, ["unmount", sb.mnt], environment: env)
        #expect(u.ok, "unmount: \(u)")
        let again = E2E.run(E2E.coffer, ["mount", sb.container, sb.mnt, "--passfile", sb.passfile], environment: env)
        try #require(again.ok, "remount: \(again)")
        #expect(E2E.read(sb.mnt + "/sparse.bin") == sparse, "the file reads back what was written")
        #expect(E2E.run(E2E.coffer, ["unmount", sb.mnt], environment: env).ok)
        let fsck = E2E.run(E2E.coffer, ["fsck", sb.container, "--passfile", sb.passfile], environment: env)
        #expect(fsck.ok, "fsck after writing: \(fsck)")
        // A copy seals as its source did (the kinds rows travel with the sealed rows): it verifies and reads the same.
        let copy = sb.root + "/copy"
        let c = E2E.run(E2E.coffer, ["copy", sb.container, copy, "--verify", "--passfile", sb.passfile], environment: env)
        #expect(c.ok, "copy: \(c)")
        try #require(E2E.run(E2E.coffer, ["mount", copy, sb.mnt, "--passfile", sb.passfile], environment: env).ok)
        #expect(E2E.read(sb.mnt + "/sparse.bin") == sparse, "the copy reads what its source held")
        #expect(E2E.run(E2E.coffer, ["unmount", sb.mnt], environment: env).ok)
        let form = fixture == "format-1" ? "coffer.chunk.v1" : "coffer.chunk.v2"
        let info = E2E.run(E2E.coffer, ["info", copy, "--passfile", sb.passfile], environment: env)
        #expect(info.ok && info.stdout.contains("Chunk sealing:") && info.stdout.contains("(\(form)"), "\(info)")
        for store in [sb.container + "/store.db", copy + "/store.db"] {
            let kinds = E2E.py(
                "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT transformer FROM coffer_kinds WHERE kind = 3').fetchone()[0])",
                [store])
            #expect(kinds.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == form, "\(store): \(kinds)")
        }
    }

    /// Every path under `root` (root itself as "."), recorded as the manifest records it.
    static func walk(_ root: String) throws -> [FormatFixture.Entry] {
        var entries: [FormatFixture.Entry] = []
        var pending = ["."]
        while let rel = pending.popLast() {
            let path = rel == "." ? root : root + "/" + rel
            let st = try required(E2E.lstatOf(path), "lstat \(rel)")
            let kind = st.st_mode & S_IFMT
            var e = FormatFixture.Entry(
                path: rel, type: kind == S_IFDIR ? "dir" : kind == S_IFLNK ? "symlink" : kind == S_IFREG ? "file" : "other",
                mode: st.st_mode, uid: st.st_uid, gid: st.st_gid, size: UInt64(st.st_size),
                blocks: kind == S_IFREG ? UInt64(st.st_blocks) : nil, nlink: UInt64(st.st_nlink),
                mtime: (Int64(st.st_mtim.tv_sec), Int64(st.st_mtim.tv_nsec)))
            switch kind {
            case S_IFLNK:
                var target = try FileManager.default.destinationOfSymbolicLink(atPath: path)
                if target.hasPrefix(root + "/") {
                    target = FormatFixture.mountpointToken + target.dropFirst(root.count)
                    e.size = nil
                }
                e.target = target
            case S_IFDIR:
                e.xattrs = try xattrs(path)
                let names = try FileManager.default.contentsOfDirectory(atPath: path)
                pending += names.map { rel == "." ? $0 : rel + "/" + $0 }
            default:
                e.xattrs = try xattrs(path)
                let sum = E2E.run("/usr/bin/sha256sum", ["-b", path])
                try #require(sum.ok, "\(sum)")
                e.sha256 = String(sum.stdout.prefix(64))
            }
            entries.append(e)
        }
        return entries
    }

    /// user.* attributes, values in hex.
    static func xattrs(_ path: String) throws -> [String: String] {
        var names = [CChar](repeating: 0, count: 4096)
        let n = XattrCalls.llist(path, &names, names.count)
        try #require(n >= 0, "listxattr \(path): errno \(errno)")
        var out: [String: String] = [:]
        for raw in names[0..<n].split(separator: 0) {
            let name = String(decoding: raw.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            var value = [UInt8](repeating: 0, count: 65536)
            let size = XattrCalls.lget(path, name, &value, value.count)
            try #require(size >= 0, "getxattr \(path) \(name): errno \(errno)")
            out[name] = Array(value[0..<size]).fixtureHex
        }
        return out
    }
}
