import Foundation
import Glibc
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore

@Suite("Names: directories, links, rename")
struct NamespaceTests {
    @Test func mkdirRmdirAndNlink() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        #expect(try f.fs.getattr(root).nlink == 2)
        let a = try f.mkdir("a")
        let attrs = try f.fs.getattr(a)
        #expect(attrs.mode == UInt32(S_IFDIR) | 0o755)
        #expect(attrs.nlink == 2)
        #expect(try f.fs.getattr(root).nlink == 3)
        try f.mkdir("b")
        #expect(try f.fs.getattr(root).nlink == 4)
        try f.mkdir("sub1", in: a)
        try f.mkdir("sub2", in: a)
        try f.file("plain", in: a)
        #expect(try f.fs.getattr(a).nlink == 4, "2 + two subdirectories; files do not count")
        expectError(FSError.exists) { _ = try f.mkdir("a") }
        expectError(FSError.notEmpty) { try f.fs.rmdir(parent: root, name: b("a")) }
        expectError(FSError.notDirectory) { try f.fs.rmdir(parent: a, name: b("plain")) }
        expectError(FSError.isDirectory) { try f.fs.unlink(parent: root, name: b("a")) }
        expectError(FSError.notFound) { try f.fs.rmdir(parent: root, name: b("nope")) }
        try f.fs.rmdir(parent: a, name: b("sub1"))
        #expect(try f.fs.getattr(a).nlink == 3)
        try f.fs.rmdir(parent: a, name: b("sub2"))
        try f.fs.unlink(parent: a, name: b("plain"))
        try f.fs.rmdir(parent: root, name: b("a"))
        #expect(try f.fs.getattr(root).nlink == 3)
        expectError(FSError.notFound) { _ = try f.fs.lookup(parent: root, name: b("a")) }
        #expect(try f.list() == ["b"])
        // Creating inside a removed directory (still known by inode) fails.
        expectSomeError(FSError.self) { _ = try f.mkdir("x", in: a) }
        // Lookups in a file are ENOTDIR.
        let file = try f.file("f")
        expectError(FSError.notDirectory) { _ = try f.fs.lookup(parent: file, name: b("x")) }
        expectError(FSError.notDirectory) { _ = try f.mkdir("x", in: file) }
        try f.remount()
        #expect(try f.fs.getattr(root).nlink == 3)
        #expect(Set(try f.list()) == ["b", "f"])
    }

    /// A directory record put back from an older state (a replayed sealed row) says two links though
    /// three subdirectories are there: removing them leaves the count at its floor instead of crashing.
    @Test func aLinkCountFromAnOlderRecordStopsAtItsFloor() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let a = try f.mkdir("a")
        for name in ["x", "y", "z"] { try f.mkdir(name, in: a) }
        try f.fs.commit()
        var old = try #require(try f.store.inode(a))
        old.nlink = 2
        try f.store.putInode(a, old)
        try f.store.commit()
        try f.remount()
        for name in ["x", "y", "z"] { try f.fs.rmdir(parent: a, name: b(name)) }
        #expect(try f.fs.getattr(a).nlink == 2)
        try f.fs.rename(parent: root, name: b("a"), newParent: root, newName: b("renamed"), flags: [])
        try f.fs.rmdir(parent: root, name: b("renamed"))
        #expect(try f.list().isEmpty)
    }

    @Test func aNewRecordGoesOutWithTheCommitThatCarriesItsEntry() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.fs.mknod(parent: root, name: b("new"), mode: UInt32(S_IFREG) | 0o640, rdev: 0, caller: caller).ino
        // The entry is in the store at once (lookups read it); the record goes out with the next commit.
        #expect(try f.store.entry(parent: root, name: b("new"))?.ino == ino)
        #expect(try f.store.inode(ino) == nil)
        try f.crashAndRemount()
        let attrs = try f.fs.lookup(parent: root, name: b("new"))
        #expect(attrs.ino == ino && attrs.mode == UInt32(S_IFREG) | 0o640)
        // A taken name is EEXIST and leaves the entry and the file as they were.
        expectError(FSError.exists) { _ = try f.fs.mknod(parent: root, name: b("new"), mode: UInt32(S_IFREG) | 0o600, rdev: 0, caller: caller) }
        #expect(try f.store.entry(parent: root, name: b("new"))?.ino == ino)
        #expect(try f.fs.getattr(ino).mode == UInt32(S_IFREG) | 0o640)
    }

    @Test func unlinkAndHardLinks() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("one", b("shared content"))
        let d = try f.mkdir("d")
        #expect(try f.fs.link(ino, newParent: d, newName: b("two")).nlink == 2)
        #expect(try f.fs.getattr(ino).nlink == 2)
        #expect(try f.ino("two", in: d) == ino)
        expectError(FSError.exists) { _ = try f.fs.link(ino, newParent: d, newName: b("two")) }
        expectError(FSError.permission) { _ = try f.fs.link(d, newParent: root, newName: b("dirlink")) }
        try f.fs.unlink(parent: root, name: b("one"))
        #expect(try f.fs.getattr(ino).nlink == 1)
        #expect(try f.contents(ino) == b("shared content"))
        expectError(FSError.notFound) { try f.fs.unlink(parent: root, name: b("one")) }
        let cid = try #require(f.contentId(ino))
        try f.fs.unlink(parent: d, name: b("two"))
        // The kernel still holds the inode (it may be open without a handle): kept as an orphan ...
        try f.fs.commit()
        #expect(try f.store.orphans() == [ino])
        #expect(try f.contents(ino) == b("shared content"))
        // ... and gone with the kernel's forget.
        f.fs.forget(ino, lookups: .max)
        #expect(try f.store.inode(ino) == nil)
        #expect(try f.store.chunkIndices(file: cid).isEmpty)
        #expect(try f.store.orphans().isEmpty)
        #expect(try f.list(d).isEmpty)
    }

    @Test func renameOverAnExistingFile() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let src = try f.file("src", b("new"))
        let dst = try f.file("dst", b("old"))
        let dstContent = try #require(f.contentId(dst))
        try f.fs.rename(parent: root, name: b("src"), newParent: root, newName: b("dst"), flags: [])
        #expect(try f.ino("dst") == src)
        #expect(try f.contents(src) == b("new"))
        expectError(FSError.notFound) { _ = try f.fs.lookup(parent: root, name: b("src")) }
        try f.fs.commit()
        #expect(try f.store.orphans() == [dst], "the replaced file stays while the kernel holds it")
        f.fs.forget(dst, lookups: .max)
        #expect(try f.store.inode(dst) == nil, "the replaced file is gone")
        #expect(try f.store.chunkIndices(file: dstContent).isEmpty)
        #expect(try f.list() == ["dst"])
        // Renaming onto itself (or another link of the same inode) is a no-op.
        _ = try f.fs.link(src, newParent: root, newName: b("alias"))
        try f.fs.rename(parent: root, name: b("dst"), newParent: root, newName: b("alias"), flags: [])
        #expect(Set(try f.list()) == ["dst", "alias"])
        #expect(try f.fs.getattr(src).nlink == 2)
        try f.fs.rename(parent: root, name: b("dst"), newParent: root, newName: b("dst"), flags: [])
        #expect(Set(try f.list()) == ["dst", "alias"])
        // Missing source.
        expectError(FSError.notFound) { try f.fs.rename(parent: root, name: b("nope"), newParent: root, newName: b("x"), flags: []) }
        try f.remount()
        #expect(Set(try f.list()) == ["dst", "alias"])
        #expect(try f.contents(try f.ino("alias")) == b("new"))
    }

    @Test func renameDirectories() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let a = try f.mkdir("a"), b1 = try f.mkdir("b")
        let moving = try f.mkdir("moving", in: a)
        try f.file("inside", in: moving, b("x"))
        let empty = try f.mkdir("empty", in: b1)
        let full = try f.mkdir("full", in: b1)
        try f.file("f", in: full)
        let file = try f.file("file", in: b1)
        #expect(try f.fs.getattr(a).nlink == 3)
        #expect(try f.fs.getattr(b1).nlink == 4)
        // Directory over a non-empty directory.
        expectError(FSError.notEmpty) { try f.fs.rename(parent: a, name: b("moving"), newParent: b1, newName: b("full"), flags: []) }
        // Directory over a file, file over a directory.
        expectError(FSError.notDirectory) { try f.fs.rename(parent: a, name: b("moving"), newParent: b1, newName: b("file"), flags: []) }
        expectError(FSError.isDirectory) { try f.fs.rename(parent: b1, name: b("file"), newParent: b1, newName: b("empty"), flags: []) }
        // Directory over an empty directory, across parents.
        try f.fs.rename(parent: a, name: b("moving"), newParent: b1, newName: b("empty"), flags: [])
        #expect(try f.ino("empty", in: b1) == moving)
        #expect(try f.store.inode(empty) == nil)
        #expect(try f.fs.getattr(a).nlink == 2)
        #expect(try f.fs.getattr(b1).nlink == 4, "lost one subdir (replaced), gained one")
        #expect(try f.list(moving) == ["inside"])
        // Plain move of a directory to another parent.
        try f.fs.rename(parent: b1, name: b("full"), newParent: a, newName: b("full2"), flags: [])
        #expect(try f.fs.getattr(a).nlink == 3)
        #expect(try f.fs.getattr(b1).nlink == 3)
        #expect(try f.list(try f.ino("full2", in: a)) == ["f"])
        _ = file
        try f.remount()
        #expect(try f.fs.getattr(a).nlink == 3)
        #expect(try f.fs.getattr(b1).nlink == 3)
    }

    @Test func renameNoReplace() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let x = try f.file("x", b("x")), y = try f.file("y", b("y"))
        expectError(FSError.exists) { try f.fs.rename(parent: root, name: b("x"), newParent: root, newName: b("y"), flags: .noReplace) }
        #expect(try f.ino("x") == x && f.ino("y") == y)
        try f.fs.rename(parent: root, name: b("x"), newParent: root, newName: b("z"), flags: .noReplace)
        #expect(Set(try f.list()) == ["y", "z"])
        expectError(FSError.invalid) { try f.fs.rename(parent: root, name: b("z"), newParent: root, newName: b("w"), flags: [.noReplace, .exchange]) }
        expectError(FSError.invalid) {
            try f.fs.rename(parent: root, name: b("z"), newParent: root, newName: b("w"), flags: RenameFlags(rawValue: 4))
        }
    }

    @Test func renameExchange() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let x = try f.file("x", b("xx")), y = try f.file("y", b("yy"))
        try f.fs.rename(parent: root, name: b("x"), newParent: root, newName: b("y"), flags: .exchange)
        #expect(try f.ino("x") == y)
        #expect(try f.ino("y") == x)
        #expect(try f.contents(try f.ino("x")) == b("yy"))
        expectError(FSError.notFound) { try f.fs.rename(parent: root, name: b("x"), newParent: root, newName: b("missing"), flags: .exchange) }

        // File <-> directory across parents: the parents' link counts follow the directory.
        let d1 = try f.mkdir("d1"), d2 = try f.mkdir("d2")
        let file = try f.file("file", in: d1, b("in d1"))
        let sub = try f.mkdir("sub", in: d2)
        try f.file("child", in: sub)
        #expect(try f.fs.getattr(d1).nlink == 2)
        #expect(try f.fs.getattr(d2).nlink == 3)
        try f.fs.rename(parent: d1, name: b("file"), newParent: d2, newName: b("sub"), flags: .exchange)
        #expect(try f.ino("file", in: d1) == sub)
        #expect(try f.ino("sub", in: d2) == file)
        #expect(try f.fs.getattr(d1).nlink == 3)
        #expect(try f.fs.getattr(d2).nlink == 2)
        #expect(try f.list(try f.ino("file", in: d1)) == ["child"])
        // Types in listings follow the exchange.
        let entries = try f.fs.readdir(d1, handle: try f.fs.opendir(d1, caller: caller), offset: 0, limit: 10, plus: false)
        let fileEntry = entries.first { $0.name == b("file") }
        #expect(fileEntry?.type == UInt32(S_IFDIR))
        try f.remount()
        #expect(try f.fs.getattr(d1).nlink == 3)
        #expect(try f.fs.getattr(d2).nlink == 2)
        #expect(try f.ino("file", in: d1) == sub)
        #expect(try f.contents(try f.ino("sub", in: d2)) == b("in d1"))
    }

    @Test func nameLengthsAndInvalidNames() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let long255 = String(repeating: "n", count: 255)
        let ino = try f.file(long255, b("ok"))
        #expect(try f.ino(long255) == ino)
        #expect(try f.list() == [long255])
        let long256 = String(repeating: "n", count: 256)
        expectError(FSError.nameTooLong) { _ = try f.create(long256) }
        expectError(FSError.nameTooLong) { _ = try f.mkdir(long256) }
        expectError(FSError.nameTooLong) { _ = try f.fs.lookup(parent: root, name: b(long256)) }
        expectError(FSError.nameTooLong) { _ = try f.fs.symlink(parent: root, name: b(long256), target: b("x"), caller: caller) }
        expectError(FSError.nameTooLong) { _ = try f.fs.link(ino, newParent: root, newName: b(long256)) }
        expectError(FSError.nameTooLong) { try f.fs.rename(parent: root, name: b(long255), newParent: root, newName: b(long256), flags: []) }
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            expectError(FSError.invalid, "name \(bad.debugDescription)") { _ = try f.create(bad) }
        }
        // Names are bytes: non-UTF-8 works, 255 multi-byte bytes work.
        let odd: [UInt8] = [0xFF, 0xFE, 0x41]
        let (attr, open) = try f.fs.create(parent: root, name: odd, mode: 0o600, flags: O_RDWR, caller: caller)
        f.fs.release(attr.ino, handle: open.handle)
        #expect(try f.fs.lookup(parent: root, name: odd).ino == attr.ino)
        let utf = String(repeating: "é", count: 127) + "x"  // 255 bytes
        #expect(utf.utf8.count == 255)
        try f.file(utf)
        #expect(try f.list().contains(utf))
    }

    @Test func readdirPagingResumesAtTheCookie() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let d = try f.mkdir("many")
        let names = (0..<3000).map { String(format: "entry-%04d", $0) }
        for n in names {
            let (ino, h) = try f.create(n, in: d)
            f.fs.release(ino, handle: h)
            f.fs.forget(ino, lookups: 1)
        }
        // Small pages: each name exactly once, "." and ".." first. No handle is needed.
        var seen: [String] = []
        var cookies: [Int64] = []
        var offset: Int64 = 0
        var calls = 0
        while true {
            let page = try f.fs.readdir(d, handle: .none, offset: offset, limit: 7, plus: false)
            if page.isEmpty { break }
            #expect(page.count <= 7)
            seen += page.map { String(decoding: $0.name, as: UTF8.self) }
            cookies += page.map(\.offset)
            offset = page.last!.offset
            calls += 1
        }
        #expect(seen.prefix(2) == [".", ".."])
        #expect(cookies.prefix(2) == [1, 2])
        let listed = Array(seen.dropFirst(2))
        #expect(listed.count == 3000)
        #expect(Set(listed) == Set(names))
        #expect(Set(cookies).count == cookies.count && cookies.allSatisfy { $0 > 0 }, "cookies are distinct and positive")
        #expect(calls == (3002 + 6) / 7)
        // Resuming from a cookie in the middle gives exactly the rest (telldir/seekdir); so does a handle.
        let mid = try f.fs.readdir(d, handle: 12345, offset: cookies[1500], limit: 10_000, plus: false)
        #expect(mid.map { String(decoding: $0.name, as: UTF8.self) } == Array(seen[1501...]))
        #expect(try f.fs.readdir(d, handle: .none, offset: cookies.last!, limit: 10, plus: false).isEmpty)
        expectError(FSError.invalid) { _ = try f.fs.readdir(d, handle: .none, offset: -1, limit: 10, plus: false) }
        expectError(FSError.notDirectory) { _ = try f.fs.opendir(try f.ino("entry-0001", in: d), caller: caller) }
        expectError(FSError.notDirectory) { _ = try f.fs.readdir(try f.ino("entry-0001", in: d), handle: .none, offset: 0, limit: 1, plus: false) }
    }

    /// Without a snapshot, a listing sees changes made while it runs as POSIX allows: an entry removed
    /// before it is reached is not listed, an added one may be, and every entry left alone comes exactly once.
    @Test func readdirAcrossChanges() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let d = try f.mkdir("changing")
        let names = (0..<600).map { "n\($0)" }
        for n in names { try f.file(n, in: d) }
        var seen: [String] = []
        var offset: Int64 = 2
        var removed: Set<String> = [], added: Set<String> = []
        var round = 0
        while true {
            let page = try f.fs.readdir(d, handle: .none, offset: offset, limit: 50, plus: false)
            guard let last = page.last else { break }
            seen += page.map { String(decoding: $0.name, as: UTF8.self) }
            offset = last.offset
            // Between pages: remove ten entries not listed yet and two listed ones; add ten.
            let unseen = names.filter { !seen.contains($0) && !removed.contains($0) }
            for n in unseen.prefix(10) + seen.filter({ names.contains($0) && !removed.contains($0) }).prefix(2) {
                try f.fs.unlink(parent: d, name: b(n))
                removed.insert(n)
            }
            for i in 0..<10 {
                let n = "new-\(round)-\(i)"
                try f.file(n, in: d)
                added.insert(n)
            }
            round += 1
        }
        let counts = Dictionary(seen.map { ($0, 1) }, uniquingKeysWith: +)
        #expect(counts.values.allSatisfy { $0 == 1 }, "an entry listed twice")
        let untouched = Set(names).subtracting(removed)
        #expect(untouched.isSubset(of: Set(seen)), "entries left alone are missing")
        let removedUnseen = removed.filter { n in !seen.contains(n) }
        #expect(!removedUnseen.isEmpty && Set(seen).isDisjoint(with: removedUnseen))
        #expect(Set(seen).isSubset(of: untouched.union(removed).union(added)))
    }

    /// Cookies name rows by tag prefix and rank; rows sharing a prefix resume at the right one.
    @Test func listingCursorRanksSharedPrefixes() {
        func tag(_ first: UInt8, _ last: UInt8) -> [UInt8] { [first, 0, 0, 0, 0, 0, 0, 0] + [UInt8](repeating: 0, count: 7) + [last] }
        // Three rows share a prefix (they differ only past the first 54 bits), then one more.
        let tags = [tag(1, 1), tag(1, 2), tag(1, 3), tag(2, 0)]
        var cursor = ListingCursor(resume: nil)
        let cookies = tags.map { cursor.advance(tag: $0) }
        #expect(cookies.map { $0?.rank } == [0, 1, 2, 0])
        #expect(Set(cookies.compactMap { $0?.value }).count == 4)
        #expect(cookies.allSatisfy { ($0?.value ?? 0) > DirectoryCookie.afterDotDot })
        // Resuming after the second row of the group skips the first two of its rows.
        let resume = DirectoryCookie(cookies[1]!.value)
        #expect(resume == cookies[1])
        var again = ListingCursor(resume: resume)
        #expect(tags.map { again.advance(tag: $0)?.value } == [nil, nil, cookies[2]!.value, cookies[3]!.value])
        // The lower bound sorts before every row of the prefix and after every row before it.
        let bound = cookies[1]!.lowerBound
        #expect(bound.lexicographicallyPrecedes(tags[0]))
        #expect(([0, 255] + [UInt8](repeating: 255, count: 14)).lexicographicallyPrecedes(bound))
        #expect(DirectoryCookie(0) == nil && DirectoryCookie(1) == nil && DirectoryCookie(2) == nil)
        #expect(DirectoryCookie(prefix: (1 << 54) - 1, rank: 255).value == (1 << 62) + 2, "the largest cookie fits an off_t")
    }

    /// readdirplus reads each page's inodes in one store call: in pages of 7 every entry still comes
    /// once with its own attributes, a damaged inode is left out (as before), and nothing read ahead
    /// stays in memory once the kernel forgets what it was handed.
    @Test func readdirPlusReadsPagesOfInodesAndKeepsNothingExtra() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        var sizes: [[UInt8]: UInt64] = [:]
        var damaged: InodeNumber = 0
        for i in 0..<30 {
            let name = b("f\(i)")
            let ino = try f.file("f\(i)", [UInt8](repeating: 1, count: i))
            f.fs.forget(ino, lookups: 1)
            if i == 13 { damaged = ino } else { sizes[name] = UInt64(i) }
        }
        try f.fs.commit()
        try f.store.backend.putInode(damaged, sealed: [UInt8](repeating: 0x5A, count: 64))
        try f.store.commit()
        let h = try f.fs.opendir(root, caller: caller)
        var seen: [[UInt8]: UInt64] = [:]
        var offset: Int64 = 0
        while true {
            let page = try f.fs.readdir(root, handle: h, offset: offset, limit: 7, plus: true)
            guard let last = page.last else { break }
            offset = last.offset
            for e in page where e.name != b(".") && e.name != b("..") {
                #expect(seen[e.name] == nil, "listed twice")
                seen[e.name] = e.attributes?.size
                f.fs.forget(e.ino, lookups: 1)
            }
        }
        #expect(seen == sizes)
        let left = f.fs.inodes.keys.filter { $0 != root }
        #expect(left.isEmpty, "read ahead and never handed out: \(left)")
    }

    @Test func readdirPlusCountsLookups() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("a", b("data"))
        f.fs.forget(ino, lookups: 1)  // the create's reference
        #expect(f.fs.inodes[ino] == nil, "an inode with no references and no handles leaves memory")
        let h = try f.fs.opendir(root, caller: caller)
        let plain = try f.fs.readdir(root, handle: h, offset: 0, limit: 100, plus: false)
        let noAttributes = plain.allSatisfy { $0.attributes == nil }
        #expect(noAttributes)
        #expect(f.fs.inodes[ino] == nil, "plain readdir takes no references")
        let plus = try f.fs.readdir(root, handle: h, offset: 0, limit: 100, plus: true)
        let entry = try required(plus.first(where: { $0.name == b("a") }))
        #expect(entry.attributes?.size == 4)
        #expect(entry.attributes?.ino == ino)
        #expect(f.fs.inodes[ino]?.lookups == 1)
        _ = try f.fs.readdir(root, handle: h, offset: 2, limit: 100, plus: true)
        #expect(f.fs.inodes[ino]?.lookups == 2)
        f.fs.releasedir(root, handle: h)
        f.fs.forget(ino, lookups: 1)
        #expect(f.fs.inodes[ino]?.lookups == 1)
        f.fs.forget(ino, lookups: 1)
        #expect(f.fs.inodes[ino] == nil)
        // lookup counts too; forgetting more than held is harmless.
        _ = try f.fs.lookup(parent: root, name: b("a"))
        _ = try f.fs.lookup(parent: root, name: b("a"))
        #expect(f.fs.inodes[ino]?.lookups == 2)
        f.fs.forget(ino, lookups: 10)
        #expect(f.fs.inodes[ino] == nil)
        #expect(try f.contents(ino) == b("data"))
        // The root stays.
        f.fs.forget(root, lookups: 1)
        #expect(try f.fs.getattr(root).ino == root)
    }

    @Test func mknodCreatesSpecialFiles() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let fifo = try f.fs.mknod(parent: root, name: b("fifo"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0, caller: caller)
        #expect(fifo.mode == UInt32(S_IFIFO) | 0o644)
        let dev = try f.fs.mknod(parent: root, name: b("dev"), mode: UInt32(S_IFCHR) | 0o600, rdev: 0x0103, caller: caller)
        #expect(dev.rdev == 0x0103)
        expectError(FSError.invalid) { _ = try f.fs.mknod(parent: root, name: b("dir"), mode: UInt32(S_IFDIR) | 0o755, rdev: 0, caller: caller) }
        try f.remount()
        #expect(try f.fs.getattr(dev.ino).rdev == 0x0103)
        #expect(try f.fs.getattr(fifo.ino).mode == UInt32(S_IFIFO) | 0o644)
    }
}
