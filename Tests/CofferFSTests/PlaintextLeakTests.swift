import CofferCrypto
import Foundation
import Glibc
import Logging
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore

/// Nothing written through the filesystem may appear in clear anywhere in the container directory.
@Suite("No plaintext in the container")
struct PlaintextLeakTests {
    static func encodings(_ marker: String) -> [(String, [UInt8])] {
        var le: [UInt8] = [], be: [UInt8] = []
        for u in marker.utf16 {
            le += [UInt8(u & 0xFF), UInt8(u >> 8)]
            be += [UInt8(u >> 8), UInt8(u & 0xFF)]
        }
        let b64 = Data(marker.utf8).base64EncodedString()
        return [
            ("UTF-8", Array(marker.utf8)), ("UTF-16LE", le), ("UTF-16BE", be),
            ("base64", Array(b64.utf8)), ("base64 unpadded", Array(b64.trimmingCharacters(in: ["="]).utf8))
        ]
    }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, haystack.count >= needle.count else { return false }
        let first = needle[0]
        var i = 0
        let limit = haystack.count - needle.count
        return haystack.withUnsafeBufferPointer { h in
            while i <= limit {
                if h[i] == first {
                    var j = 1
                    while j < needle.count && h[i + j] == needle[j] { j += 1 }
                    if j == needle.count { return true }
                }
                i += 1
            }
            return false
        }
    }

    /// Every regular file under `dir`, with its bytes.
    static func allFiles(_ dir: String) throws -> [(String, [UInt8])] {
        var out: [(String, [UInt8])] = []
        guard let e = FileManager.default.enumerator(atPath: dir) else { throw TestFailure("cannot list \(dir)") }
        while let rel = e.nextObject() as? String {
            var isDir: ObjCBool = false
            let p = dir + "/" + rel
            if FileManager.default.fileExists(atPath: p, isDirectory: &isDir), !isDir.boolValue {
                out.append((rel, [UInt8](try Data(contentsOf: URL(fileURLWithPath: p)))))
            }
        }
        return out
    }

    @Test func noMarkerInAnyFileOfTheContainer() throws {
        let tmp = try makeTempDir("coffer-leak")
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        let vault = tmp + "/vault"
        var options = Container.CreateOptions()
        options.kdf = .scrypt(logN: 16, r: 8, p: 1)
        let made = try Container.create(at: vault, password: SecureBytes(copying: Array("pw".utf8)), options: options)
        let store = try EntityStore.open(at: try made.container.storePath(), keys: made.keys)
        var fsOptions = CofferFileSystem.Options()
        fsOptions.symlinkRoot = "/mnt/LeakTestMount"
        let fs = try CofferFileSystem(
            store: store, chunkSize: made.container.header.chunkSize, options: fsOptions, statfsPath: vault, logger: Logger(label: "leak"))

        let id = UUID().uuidString.prefix(8)
        let markers = [
            "SecretDocumentName-\(id)", "SecretDirectoryName-\(id)", "SecretXattrName-\(id)", "SecretXattrValue-\(id)",
            "SecretLinkTarget-\(id)", "SecretLinkName-\(id)", "TopSecretContent-\(id)"
        ]
        let dir = try fs.mkdir(parent: root, name: b(markers[1]), mode: 0o755, caller: caller).ino
        let (attr, open) = try fs.create(parent: dir, name: b(markers[0] + ".txt"), mode: 0o644, flags: O_RDWR, caller: caller)
        let content = Array(String(repeating: markers[6] + " ", count: 20_000).utf8)  // several chunks
        _ = try content.withUnsafeBytes { try fs.write(attr.ino, handle: open.handle, offset: 0, data: $0) }
        let small = Array((markers[6] + "-small").utf8)  // and one tiny file
        let (attr2, open2) = try fs.create(parent: root, name: b("tiny"), mode: 0o644, flags: O_RDWR, caller: caller)
        _ = try small.withUnsafeBytes { try fs.write(attr2.ino, handle: open2.handle, offset: 0, data: $0) }
        fs.release(attr2.ino, handle: open2.handle)
        fs.release(attr.ino, handle: open.handle)
        try fs.setxattr(attr.ino, name: b("user." + markers[2]), value: b(markers[3]), flags: 0)
        _ = try fs.symlink(parent: dir, name: b(markers[5]), target: b("/etc/" + markers[4]), caller: caller)
        _ = try fs.symlink(parent: dir, name: b("inside"), target: b("/mnt/LeakTestMount/" + markers[4]), caller: caller)
        _ = try fs.symlink(parent: dir, name: b("relative"), target: b("../" + markers[4]), caller: caller)
        // Some churn: a renamed and a deleted name must not linger either.
        try fs.rename(parent: dir, name: b(markers[0] + ".txt"), newParent: dir, newName: b(markers[0] + ".renamed"), flags: [])
        try fs.commit()
        fs.shutdown()

        let files = try Self.allFiles(vault)
        let names = files.map(\.0)
        #expect(names.contains(SQLiteBackend.fileName))
        let totalBytes = files.reduce(0) { $0 + $1.1.count }
        #expect(totalBytes > content.count, "the container holds the content (sealed)")
        for (path, bytes) in files {
            for m in markers {
                for (encoding, needle) in Self.encodings(m) {
                    #expect(!Self.contains(bytes, needle), "\(m) found in \(path) as \(encoding)")
                }
            }
        }
        // The scan itself works: a plain file in the same directory holding each encoding is caught.
        let control = vault + "/control.bin"
        var controlBytes: [UInt8] = [0, 1, 2]
        for m in markers { for (_, needle) in Self.encodings(m) { controlBytes += needle + [0x20] } }
        try Data(controlBytes).write(to: URL(fileURLWithPath: control))
        let rescanned = try Self.allFiles(vault)
        let controlFile = try required(rescanned.first(where: { $0.0 == "control.bin" }))
        for m in markers {
            for (encoding, needle) in Self.encodings(m) {
                #expect(Self.contains(controlFile.1, needle), "the scan misses \(m) as \(encoding)")
            }
        }

        // And the data is really there: it reads back through a new mount.
        let reopened = try EntityStore.open(at: try made.container.storePath(), keys: made.keys)
        let fs2 = try CofferFileSystem(
            store: reopened, chunkSize: made.container.header.chunkSize, options: fsOptions, statfsPath: vault, logger: Logger(label: "leak"))
        defer { fs2.shutdown() }
        let d2 = try fs2.lookup(parent: root, name: b(markers[1])).ino
        let f2 = try fs2.lookup(parent: d2, name: b(markers[0] + ".renamed")).ino
        let h = try fs2.open(f2, flags: O_RDONLY, caller: caller).handle
        #expect(try fs2.read(f2, handle: h, offset: 0, size: content.count + 1) == content)
        fs2.release(f2, handle: h)
        #expect(try fs2.getxattr(f2, name: b("user." + markers[2])) == b(markers[3]))
        #expect(try fs2.readlink(try fs2.lookup(parent: d2, name: b("inside")).ino) == b("/mnt/LeakTestMount/" + markers[4]))
    }
}
