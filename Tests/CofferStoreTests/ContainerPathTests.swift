import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore

@Suite("Container-relative path transformer")
struct ContainerPathTests {
    let root = b("/home/ann/Vault")

    @Test func insideTheRootIsStoredRelative() {
        #expect(ContainerPathTransformer.store(b("/home/ann/Vault/docs/a.txt"), root: root) == .relative(b("docs/a.txt")))
        #expect(ContainerPathTransformer.store(b("/home/ann/Vault/x"), root: root) == .relative(b("x")))
        // Trailing slashes on the root do not matter.
        #expect(ContainerPathTransformer.store(b("/home/ann/Vault/x"), root: b("/home/ann/Vault///")) == .relative(b("x")))
        // Names that merely look like dots are ordinary names.
        #expect(ContainerPathTransformer.store(b("/home/ann/Vault/.hidden/...x"), root: root) == .relative(b(".hidden/...x")))
    }

    @Test func theRootItself() throws {
        #expect(ContainerPathTransformer.store(root, root: root) == .relative([]))
        #expect(try ContainerPathTransformer.resolve(.relative([]), root: b("/mnt/elsewhere")) == b("/mnt/elsewhere"))
        #expect(try ContainerPathTransformer.resolve(.relative([]), root: b("/mnt/elsewhere/")) == b("/mnt/elsewhere"))
    }

    @Test func outsideTheRootStaysVerbatim() {
        for p in ["/etc/passwd", "/home/ann", "/home/ann/VaultX/a", "/home/ann/Vaul", "/", "relative/path", "../up", "", "/home/ann/vault/a"] {
            #expect(ContainerPathTransformer.store(b(p), root: root) == .verbatim(b(p)), "\(p)")
        }
    }

    @Test func uncleanPathsStayVerbatim() throws {
        for p in [
            "/home/ann/Vault/a/../b", "/home/ann/Vault//a", "/home/ann/Vault/./a", "/home/ann/Vault/a/",
            "/home/ann/Vault/..", "/home/ann/Vault/.", "//home/ann/Vault/a", "/home/ann/./Vault/a", "/home/ann/Vault/"
        ] {
            let stored = ContainerPathTransformer.store(b(p), root: root)
            #expect(stored == .verbatim(b(p)), "\(p) was stored as \(stored)")
            // ... and they read back exactly as written, whatever the root.
            #expect(try ContainerPathTransformer.resolve(stored, root: b("/other")) == b(p))
        }
        // A NUL byte, or a root that is not absolute: verbatim.
        #expect(ContainerPathTransformer.store(b("/home/ann/Vault/a\0b"), root: root) == .verbatim(b("/home/ann/Vault/a\0b")))
        #expect(ContainerPathTransformer.store(b("/x/a"), root: b("x")) == .verbatim(b("/x/a")))
        #expect(ContainerPathTransformer.store(b("/x/a"), root: []) == .verbatim(b("/x/a")))
    }

    @Test func resolvesAgainstAnotherRoot() throws {
        let stored = ContainerPathTransformer.store(b("/home/ann/Vault/docs/a.txt"), root: root)
        #expect(try ContainerPathTransformer.resolve(stored, root: b("/media/usb/Vault")) == b("/media/usb/Vault/docs/a.txt"))
        #expect(try ContainerPathTransformer.resolve(stored, root: b("/media/usb/Vault/")) == b("/media/usb/Vault/docs/a.txt"))
        // Same root: the same bytes.
        #expect(try ContainerPathTransformer.resolve(stored, root: root) == b("/home/ann/Vault/docs/a.txt"))
        // Verbatim values ignore the root.
        #expect(try ContainerPathTransformer.resolve(.verbatim(b("/etc/hosts")), root: b("/x")) == b("/etc/hosts"))
    }

    @Test func resolvingAgainstTheFilesystemRoot() throws {
        // A relative value read with "/" as its root must give a clean absolute path, not "//docs/a".
        #expect(try ContainerPathTransformer.resolve(.relative(b("docs/a")), root: b("/")) == b("/docs/a"))
    }

    @Test func hostileStoredValuesAreRejected() {
        let r = b("/mnt/v")
        let cases: [(StoredPath, PathError)] = [
            (.relative(b("..")), .escapesRoot),
            (.relative(b("../etc/passwd")), .escapesRoot),
            (.relative(b("a/../../etc")), .escapesRoot),
            (.relative(b("a/..")), .escapesRoot),
            (.relative(b("a//../..")), .escapesRoot),
            (.relative(b("/etc/passwd")), .absoluteInjection),
            (.relative(b("//x")), .absoluteInjection),
            (.relative(b("a\0b")), .containsNul),
            (.verbatim(b("/etc\0/passwd")), .containsNul),
            (.relative([UInt8](repeating: 0x61, count: 4097)), .tooLong(4097)),
            (.verbatim([UInt8](repeating: 0x61, count: 5000)), .tooLong(5000))
        ]
        for (value, expected) in cases {
            do {
                let out = try ContainerPathTransformer.resolve(value, root: r)
                Issue.record("\(value) resolved to \(String(decoding: out, as: UTF8.self))")
            } catch {
                #expect(error == expected, "\(value)")
            }
            // Through the binary decoder: a DecodeError, never a value.
            var w = ByteWriter()
            switch value {
            case .relative(let p):
                w.u8(1)
                w.u16(UInt16(min(p.count, 65535)))
                w.raw(p)
            case .verbatim(let p):
                w.u8(0)
                w.u16(UInt16(min(p.count, 65535)))
                w.raw(p)
            }
            var reader = ByteReader(w.bytes)
            do {
                let v = try ContainerPathTransformer.decode(from: &reader)
                Issue.record("decoder accepted \(v)")
            } catch {
                switch error {
                case .invalidValue, .tooLong: break
                default: Issue.record("unexpected decode error \(error) for \(value)")
                }
            }
        }
        // Exactly at the limit is fine.
        #expect((try? ContainerPathTransformer.resolve(.relative([UInt8](repeating: 0x61, count: 4096)), root: r))?.count == 4096 + 7)
    }

    @Test func binaryRoundTrip() throws {
        for v in [
            StoredPath.relative([]), .relative(b("a/b")), .verbatim([]), .verbatim(b("/x/y")), .verbatim(b("../rel")),
            .relative([UInt8](repeating: 0x7A, count: 4096))
        ] {
            var w = ByteWriter()
            ContainerPathTransformer.encode(v, into: &w)
            var r = ByteReader(w.bytes + [0xEE])
            #expect(try ContainerPathTransformer.decode(from: &r) == v)
            #expect(r.remaining == 1, "the decoder must consume exactly its own bytes")
        }
        var r = ByteReader([7, 0, 1, 0x61])
        expectError(DecodeError.invalidValue("path tag 7")) { try ContainerPathTransformer.decode(from: &r) }
        var r2 = ByteReader([1, 0x10, 0x01])  // 4097 claimed
        expectError(DecodeError.tooLong(field: "path", length: 4097, limit: 4096)) { try ContainerPathTransformer.decode(from: &r2) }
        var r3 = ByteReader([1, 0x00, 0x05, 0x61])
        expectError(DecodeError.truncated) { try ContainerPathTransformer.decode(from: &r3) }
    }

    @Test func headerStringForm() throws {
        #expect(ContainerPathTransformer.storeString("/v/store.db", root: "/v") == "store.db")
        #expect(ContainerPathTransformer.storeString("/elsewhere/store.db", root: "/v") == "/elsewhere/store.db")
        #expect(try ContainerPathTransformer.resolveString("store.db", root: "/new/place") == "/new/place/store.db")
        #expect(try ContainerPathTransformer.resolveString("/elsewhere/store.db", root: "/new") == "/elsewhere/store.db")
        expectError(PathError.escapesRoot) { try ContainerPathTransformer.resolveString("../store.db", root: "/v") }
        expectError(PathError.escapesRoot) { try ContainerPathTransformer.resolveString("a/../../store.db", root: "/v") }
        expectError(PathError.containsNul) { try ContainerPathTransformer.resolveString("a\u{0}b", root: "/v") }
    }
}
