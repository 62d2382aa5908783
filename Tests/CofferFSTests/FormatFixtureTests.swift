import CofferCrypto
import CofferTestSupport
import Foundation
import Glibc
import Logging
import Testing
@testable import CofferFS
@testable import CofferStore

// Issue 15, item 7, below the mount: a copy of each frozen Tests/Fixtures container opened with
// its password (and with its recovery key) and read through CofferFileSystem, without FUSE, must show
// what the fixture's manifest lists (FormatFixtureTests in CofferCLITests does the same through a mount).

@Suite("Format fixtures through CofferFileSystem")
struct FormatFixtureTests {
    /// Where the absolute symlink's target is resolved (a mountpoint that never exists).
    static let symlinkRoot = "/fixture-mount"

    @Test(arguments: FormatFixture.all, ["password", "recovery key"])
    func fixtureReadsAsItsManifestSays(fixture: String, secret: String) throws {
        let dir = try makeTempDir("coffer-fixture")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FormatFixture.copyContainer(fixture, to: dir + "/c")
        let text = secret == "password" ? try FormatFixture.password(fixture) : try FormatFixture.recoveryKey(fixture)

        let container = try Container.open(at: dir + "/c")
        #expect(container.header.chunkSize == 32768)
        let keys = try container.unlock(.fromPassword(SecureBytes(copying: Array(text.utf8)))).keys
        defer { keys.wipe() }
        let store = try EntityStore.open(at: try container.storePath(), keys: keys)
        #expect(store.chunkSealing == (fixture == "format-1" ? .whole : .blocks))
        var options = CofferFileSystem.Options()
        options.symlinkRoot = Self.symlinkRoot
        let fs = try CofferFileSystem(
            store: store, chunkSize: container.header.chunkSize, options: options,
            statfsPath: dir, logger: Logger(label: "fixture"))
        defer { fs.shutdown() }

        let manifest = try FormatFixture.manifest(fixture)
        let seen = try Self.walk(fs)
        let differences = FormatFixture.differences(expected: manifest.entries, seen: seen)
        #expect(differences.isEmpty, "the filesystem differs from the manifest:\n\(differences.joined(separator: "\n"))")
    }

    /// Every path from the root (the root as "."), recorded as the manifest records it.
    static func walk(_ fs: CofferFileSystem) throws -> [FormatFixture.Entry] {
        var entries: [FormatFixture.Entry] = []
        var pending: [(path: String, ino: InodeNumber)] = [(".", root)]
        while let (rel, ino) = pending.popLast() {
            let a = try fs.getattr(ino)
            let kind = a.mode & UInt32(S_IFMT)
            var e = FormatFixture.Entry(
                path: rel, type: kind == UInt32(S_IFDIR) ? "dir" : kind == UInt32(S_IFLNK) ? "symlink" : kind == UInt32(S_IFREG) ? "file" : "other",
                mode: a.mode, uid: a.uid, gid: a.gid, size: a.size, blocks: kind == UInt32(S_IFREG) ? a.blocks : nil,
                nlink: UInt64(a.nlink), mtime: (a.mtime.seconds, Int64(a.mtime.nanoseconds)))
            switch kind {
            case UInt32(S_IFLNK):
                var target = String(decoding: try fs.readlink(ino), as: UTF8.self)
                if target.hasPrefix(symlinkRoot + "/") {
                    target = FormatFixture.mountpointToken + target.dropFirst(symlinkRoot.count)
                    e.size = nil
                }
                e.target = target
            case UInt32(S_IFDIR):
                e.xattrs = try xattrs(fs, ino)
                for entry in try list(fs, ino) {
                    let name = String(decoding: entry.name, as: UTF8.self)
                    let child = try fs.lookup(parent: ino, name: entry.name).ino
                    pending.append((rel == "." ? name : rel + "/" + name, child))
                }
            default:
                e.xattrs = try xattrs(fs, ino)
                let content = try fs.read(ino, handle: .none, offset: 0, size: Int(a.size) + 1)
                #expect(content.count == Int(a.size), "\(rel): read \(content.count) bytes of \(a.size)")
                e.sha256 = SHA256.hash(content).fixtureHex
            }
            entries.append(e)
        }
        return entries
    }

    /// A directory's entries without "." and "..", a few per readdir call so that listing resumes from cookies.
    static func list(_ fs: CofferFileSystem, _ ino: InodeNumber) throws -> [DirectoryEntry] {
        var out: [DirectoryEntry] = []
        var offset: Int64 = 0
        while true {
            let batch = try fs.readdir(ino, handle: .none, offset: offset, limit: 3, plus: false)
            guard let last = batch.last else { break }
            out += batch.filter { $0.name != b(".") && $0.name != b("..") }
            offset = last.offset
        }
        return out
    }

    static func xattrs(_ fs: CofferFileSystem, _ ino: InodeNumber) throws -> [String: String] {
        var out: [String: String] = [:]
        for name in try fs.listxattr(ino) {
            out[String(decoding: name, as: UTF8.self)] = try fs.getxattr(ino, name: name).fixtureHex
        }
        return out
    }
}
