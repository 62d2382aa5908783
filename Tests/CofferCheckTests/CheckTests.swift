import CofferCrypto
import Foundation
import Glibc
import CofferTestSupport
import Testing
@testable import CofferCheck
@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

/// Each damage is reported with its kind and path, the repair fixes it (a second check is clean),
/// and what was not damaged reads back byte for byte.
@Suite("fsck: checks and repairs") struct CheckTests {
    static let chunk = 4096

    @Test func cleanStoreHasNoProblems() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 1)
        let docs = try fx.mkdir("docs")
        let small = try fx.file("small.txt", in: docs, b("hello"))
        try fx.file("big.bin", in: docs, g.bytes(10 * Self.chunk + 100))  // 11 chunks: a paged map
        let sparse = try fx.file("sparse.bin")
        try fx.write("/sparse.bin", at: UInt64(5 * Self.chunk), b("tail"))  // positions 0-4 are holes
        let fs = try fx.mounted
        _ = try fs.link(small, newParent: rootIno, newName: b("hard"))
        _ = try fs.symlink(parent: rootIno, name: b("ln"), target: b("docs/small.txt"), caller: caller)
        try fs.setxattr(sparse, name: b("user.note"), value: b("v"), flags: 0)
        fx.unmount()

        let r = try fx.check()
        #expect(r.isClean, "\(kinds(r))")
        #expect(r.counts.inodes == 6)
        #expect(r.counts.directories == 2)
        #expect(r.counts.chunkMapPages == 1)
        #expect(r.counts.chunks == 1 + 11 + 1)
        #expect(r.counts.xattrs == 1)
    }

    @Test func deletedChunkIsReportedAndBecomesAHole() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 2)
        let big = g.bytes(10 * Self.chunk + 100)
        let other = g.bytes(3000)
        let docs = try fx.mkdir("docs")
        let ino = try fx.file("big.bin", in: docs, big)
        try fx.file("other.bin", other)
        fx.unmount()
        let file = try required(try fx.edit { try $0.inode(ino)?.contentId })
        try fx.edit { try $0.execute("DELETE FROM chunks WHERE file = \(Int64(bitPattern: file)) AND idx = 3") }

        let r = try fx.check()
        #expect(has(r, .chunkMissing, path: "/docs/big.bin", inode: ino), "\(kinds(r))")
        #expect(r.problems.count == 1, "\(kinds(r))")
        let summary = try fx.repairAndRecheck(r)
        let lost = summary.lostRanges.first
        #expect(lost?.path == "/docs/big.bin")
        #expect(lost?.ranges == [UInt64(3 * Self.chunk)..<UInt64(4 * Self.chunk)])

        try fx.mount()
        var expected = big
        for i in 3 * Self.chunk..<4 * Self.chunk { expected[i] = 0 }
        let read = try fx.contents("/docs/big.bin")
        #expect(read == expected, "the readable chunks are kept, the lost one reads as zeros")
        let otherRead = try fx.contents("/other.bin")
        #expect(otherRead == other)
        let found = try fx.names("/lost+found")
        #expect(found == ["big.bin#\(ino)"], "the damaged file is linked into /lost+found")
        let attr = try fx.mounted.getattr(ino)
        #expect(attr.nlink == 2)
    }

    /// Chunks sealed in 4 KiB blocks: a byte flipped in one block of a 32 KiB chunk loses that block only. The repair
    /// keeps the chunk's other blocks, seals it again with zeros in the damaged block, and reports 4 KiB lost.
    @Test func aDamagedBlockLosesOnlyItsFourKiB() throws {
        let fx = try CheckFixture(chunkSize: 32768)
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 24)
        let big = g.bytes(3 * 32768 + 100)
        let ino = try fx.file("big.bin", big)
        fx.unmount()
        try fx.edit { store in
            let file = try required(try store.inode(ino)?.contentId)
            var sealed = try required(try store.sealedChunks(file: file, first: 1, last: 1).first?.sealed)
            #expect(sealed.count == 32768 + 8 * 16 + 16)
            sealed[2 * 4112 + 5] ^= 0x40  // block 2 of chunk 1: file bytes 40960..<45056
            try store.execute(
                "UPDATE chunks SET value = ?, seg = NULL, off = NULL, len = NULL WHERE file = ? AND idx = 1",
                [Data(sealed), Int64(bitPattern: file)])
        }

        let r = try fx.check()
        #expect(has(r, .chunkDamaged, path: "/big.bin", inode: ino), "\(kinds(r))")
        #expect(r.problems.first?.detail.contains("unreadable bytes: 40960-45056") == true, "\(kinds(r))")
        let summary = try fx.repairAndRecheck(r)
        #expect(summary.lostRanges.first?.ranges == [UInt64(40960)..<UInt64(45056)])

        try fx.mount()
        var expected = big
        for i in 40960..<45056 { expected[i] = 0 }
        #expect(try fx.contents("/big.bin") == expected, "the chunk's other blocks are kept, the damaged one reads as zeros")
    }

    /// A chain of 40,000 directories with a damaged file at the bottom: the check names the file's whole
    /// path and keeps no path it does not report. It kept every directory's path as a string: depth²
    /// bytes, 24 GB and an out-of-memory kill at this depth (`coffer fsck` of such a container).
    @Test func aVeryDeepTreeIsCheckedWithoutKeepingItsPaths() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let name = String(repeating: "d", count: 50)
        var dir = rootIno
        for _ in 0..<40_000 { dir = try fx.mkdir(name, in: dir) }
        var g = SplitMix64(seed: 3)
        let ino = try fx.file("deep.bin", in: dir, g.bytes(3 * Self.chunk))
        fx.unmount()
        let file = try required(try fx.edit { try $0.inode(ino)?.contentId })
        try fx.edit { try $0.execute("DELETE FROM chunks WHERE file = \(Int64(bitPattern: file)) AND idx = 1") }

        let r = try fx.check()
        let expected = String(repeating: "/" + name, count: 40_000) + "/deep.bin"
        #expect(has(r, .chunkMissing, path: expected, inode: ino), "\(kinds(r))")
        #expect(r.problems.count == 1, "\(kinds(r))")
        #expect(r.counts.directories == 40_001)
    }

    @Test func olderChunkPutBackIsReported() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 3)
        let first = g.bytes(4 * Self.chunk)
        let ino = try fx.file("f.bin", first)
        try fx.file("keep.bin", b("keep"))
        fx.unmount()
        let file = try required(try fx.edit { try $0.inode(ino)?.contentId })
        let old = try required(try fx.edit { try $0.sealedChunks(file: file, first: 2, last: 2).first?.sealed })
        try fx.mount()
        let newer = g.bytes(Self.chunk)
        try fx.write("/f.bin", at: UInt64(2 * Self.chunk), newer)
        fx.unmount()
        try fx.edit { try $0.putChunk(file: file, index: 2, sealed: old) }

        let r = try fx.check()
        #expect(has(r, .chunkReplaced, path: "/f.bin", inode: ino), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        var expected = first
        for i in 2 * Self.chunk..<3 * Self.chunk { expected[i] = 0 }
        let read = try fx.contents("/f.bin")
        #expect(read == expected, "the older chunk is not served; its position is a hole")
        let keep = try fx.contents("/keep.bin")
        #expect(keep == b("keep"))
    }

    @Test func flippedInodeIsDroppedWithItsEntries() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let docs = try fx.mkdir("docs")
        let victim = try fx.file("victim.txt", in: docs, b("lost"))
        try fx.file("keep.txt", in: docs, b("kept"))
        fx.unmount()
        try fx.edit { s in
            let row = try required(try s.backend.allInodeRows().first { $0.id == victim })
            try s.flip(table: "inodes", value: row.sealed, where: "id = \(Int64(bitPattern: victim))")
        }

        let r = try fx.check()
        #expect(has(r, .inodeDamaged, path: "/docs/victim.txt", inode: victim), "\(kinds(r))")
        #expect(has(r, .entryToDamagedInode, path: "/docs/victim.txt"), "\(kinds(r))")
        #expect(has(r, .unreferencedContent), "its chunks belong to no inode that opens: \(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let names = try fx.names("/docs")
        #expect(names == ["keep.txt"])
        let keep = try fx.contents("/docs/keep.txt")
        #expect(keep == b("kept"))
    }

    @Test func flippedEntrySendsItsFileToLostAndFound() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 4)
        let a = g.bytes(5000)
        let docs = try fx.mkdir("docs")
        let aIno = try fx.file("a.bin", in: docs, a)
        try fx.file("b.txt", in: docs, b("bee"))
        fx.unmount()
        try fx.edit { s in
            let tag = s.nameTag(docs, b("a.bin"))
            let row = try required(try s.backend.allEntryRows().first { $0.tag == tag })
            try s.flip(table: "dirents", value: row.sealed, where: "tag = X'\(tag.hex)'")
        }

        let r = try fx.check()
        #expect(has(r, .entryDamaged, path: "/docs", inode: docs), "\(kinds(r))")
        #expect(has(r, .unreachable, inode: aIno), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let found = try fx.names("/lost+found")
        #expect(found == ["#\(aIno)"])
        let recovered = try fx.contents("/lost+found/#\(aIno)")
        #expect(recovered == a, "the file's content survives the loss of its name")
        let bee = try fx.contents("/docs/b.txt")
        #expect(bee == b("bee"))
        let lf = try fx.mounted.getattr(try fx.ino("/lost+found"))
        #expect(lf.mode == UInt32(S_IFDIR) | 0o700)
        let rootAttributes = try fx.mounted.getattr(1)
        #expect(lf.uid == rootAttributes.uid && lf.gid == rootAttributes.gid, "owned by the owner of the tree")
    }

    @Test func flippedMapPageKeepsTheChunksThatOpen() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 5)
        let big = g.bytes(12 * Self.chunk)
        let ino = try fx.file("big.bin", big)
        fx.unmount()
        try fx.edit { s in
            let row = try required(try s.backend.allChunkMapRows().first)
            try s.flip(table: "chunkmaps", value: row.sealed, where: "file = \(Int64(bitPattern: row.file)) AND page = 0")
        }

        let r = try fx.check()
        #expect(has(r, .chunkMapPageDamaged, path: "/big.bin", inode: ino), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let read = try fx.contents("/big.bin")
        #expect(read == big, "every chunk opens under the file key, so the rebuilt map keeps them all")
    }

    @Test func chunkRowPastTheEndIsDropped() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let content = b(String(repeating: "x", count: 1000))
        let ino = try fx.file("s.txt", content)
        fx.unmount()
        try fx.edit { s in
            let file = try required(try s.inode(ino)?.contentId)
            let cipher = try s.contentCipher(contentId: file)
            let sealed = try cipher.seal(b("stale"), index: 50)
            try s.putChunk(file: file, index: 50, sealed: sealed)
        }

        let r = try fx.check()
        #expect(has(r, .chunkPastEnd, path: "/s.txt", inode: ino), "\(kinds(r))")
        let summary = try fx.repairAndRecheck(r)
        #expect(summary.lostRanges.isEmpty, "no content was lost")
        try fx.mount()
        let read = try fx.contents("/s.txt")
        #expect(read == content)
        let names = try fx.names("/")
        #expect(names == ["s.txt"], "nothing goes to /lost+found")
    }

    @Test func strayAndDanglingEntriesAreDropped() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let f = try fx.file("f.txt", b("data"))
        fx.unmount()
        try fx.edit { s in
            try s.putEntry(parent: 0x1234_5678, DirectoryEntryRecord(name: b("ghost"), ino: f, type: UInt32(S_IFREG)))
            try s.putEntry(parent: rootIno, DirectoryEntryRecord(name: b("nowhere"), ino: 0x7777, type: UInt32(S_IFREG)))
        }

        let r = try fx.check()
        #expect(has(r, .strayEntry), "\(kinds(r))")
        #expect(has(r, .danglingEntry, path: "/nowhere", inode: 0x7777), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let names = try fx.names("/")
        #expect(names == ["f.txt"])
        let attr = try fx.mounted.getattr(f)
        #expect(attr.nlink == 1, "a stray entry is not a link")
    }

    @Test func unreachableInodeGoesToLostAndFound() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        try fx.file("f.txt", b("data"))
        fx.unmount()
        let id = try fx.edit { s in
            let id = try s.newInodeId()
            let t = StoredTime(seconds: 1_700_000_000, nanoseconds: 0)
            try s.putInode(id, InodeRecord(mode: 0o100600, uid: 0, gid: 0, nlink: 1, atime: t, mtime: t, ctime: t))
            return id
        }

        let r = try fx.check()
        #expect(has(r, .unreachable, inode: id), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let found = try fx.names("/lost+found")
        #expect(found == ["#\(id)"])
    }

    @Test func wrongLinkCountsAreFixed() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let f = try fx.file("f.txt", b("data"))
        let d = try fx.mkdir("d")
        fx.unmount()
        try fx.edit { s in
            var r = try required(try s.inode(f))
            r.nlink = 5
            try s.putInode(f, r)
            var dr = try required(try s.inode(d))
            dr.nlink = 9
            try s.putInode(d, dr)
        }

        let r = try fx.check()
        #expect(has(r, .nlinkWrong, path: "/f.txt", inode: f), "\(kinds(r))")
        #expect(has(r, .nlinkWrong, path: "/d", inode: d), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let fa = try fx.mounted.getattr(f), da = try fx.mounted.getattr(d)
        #expect(fa.nlink == 1)
        #expect(da.nlink == 2)
    }

    @Test func directoryCycleIsBroken() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let a = try fx.mkdir("a")
        let bDir = try fx.mkdir("b", in: a)
        try fx.file("f.txt", in: bDir, b("deep"))
        fx.unmount()
        try fx.edit { s in try s.putEntry(parent: bDir, DirectoryEntryRecord(name: b("up"), ino: a, type: UInt32(S_IFDIR))) }

        let r = try fx.check()
        #expect(has(r, .cycle, path: "/a/b/up", inode: a), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let names = try fx.names("/a/b")
        #expect(names == ["f.txt"])
        let deep = try fx.contents("/a/b/f.txt")
        #expect(deep == b("deep"))
    }

    /// Two directories that name each other and nothing else names (two machines moving them into each
    /// other, before that was refused): the repair links the cycle into /lost+found once, and each file
    /// in it keeps one name. A file met before its directory became a start of its own, so it got a
    /// second name in /lost+found and a link count of 2 (a tester's find).
    @Test func anUnreachableCycleIsRecoveredWithOneNamePerFile() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let p = try fx.mkdir("p"), q = try fx.mkdir("q")
        var files: [InodeNumber] = []
        for i in 0..<8 {
            files.append(try fx.file("fp\(i)", in: p, b("p\(i)")))
            files.append(try fx.file("fq\(i)", in: q, b("q\(i)")))
        }
        // Directories hanging off the cycle, with a file each: reached through it, not linked in apart.
        for i in 0..<4 { files.append(try fx.file("deep", in: try fx.mkdir("sub\(i)", in: i % 2 == 0 ? p : q), b("deep\(i)"))) }
        fx.unmount()
        try fx.edit { s in
            try s.deleteEntry(parent: rootIno, name: b("p"))
            try s.deleteEntry(parent: rootIno, name: b("q"))
            try s.putEntry(parent: p, DirectoryEntryRecord(name: b("q"), ino: q, type: UInt32(S_IFDIR)))
            try s.putEntry(parent: q, DirectoryEntryRecord(name: b("p"), ino: p, type: UInt32(S_IFDIR)))
        }

        let r = try fx.check()
        #expect(has(r, .cycle), "\(kinds(r))")
        #expect(!r.problems.contains { $0.kind == .unreachable && files.contains($0.inode ?? 0) }, "\(kinds(r))")
        #expect(!r.problems.contains { $0.kind == .directoryLinkedTwice }, "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        #expect(try fx.names("/lost+found").count == 1, "the cycle is linked in once")
        for f in files { #expect(try fx.mounted.getattr(f).nlink == 1) }
    }

    @Test func unreferencedContentIsDropped() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        try fx.file("f.txt", b("data"))
        fx.unmount()
        let before = try fx.check().counts.chunks
        try fx.edit { s in
            let file: UInt64 = 0x0abc_def1
            let cipher = try s.contentCipher(contentId: file)
            let sealed = try cipher.seal(b("nobody's"), index: 0)
            try s.putChunk(file: file, index: 0, sealed: sealed)
            _ = try s.writeChunkMapPage(file: file, page: 0, tags: [])
        }

        let r = try fx.check()
        #expect(has(r, .unreferencedContent), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        let after = try fx.check()
        #expect(after.counts.chunks == before)
        #expect(after.counts.chunkMapPages == 0)
    }

    @Test func damagedXattrIsDropped() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let f = try fx.file("f.txt", b("data"))
        try fx.mounted.setxattr(f, name: b("user.a"), value: b("1"), flags: 0)
        try fx.mounted.setxattr(f, name: b("user.b"), value: b("2"), flags: 0)
        fx.unmount()
        try fx.edit { s in
            let tag = s.xattrTag(f, b("user.a"))
            let row = try required(try s.backend.allXattrRows().first { $0.tag == tag })
            try s.flip(table: "xattrs", value: row.sealed, where: "tag = X'\(tag.hex)'")
        }

        let r = try fx.check()
        #expect(has(r, .xattrDamaged, path: "/f.txt", inode: f), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let kept = try fx.mounted.getxattr(f, name: b("user.b"))
        #expect(kept == b("2"))
    }

    @Test func damagedRootIsReplacedAndItsEntriesComeBack() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        try fx.file("f.txt", b("data"))
        fx.unmount()
        try fx.edit { s in
            let row = try required(try s.backend.allInodeRows().first { $0.id == rootIno })
            try s.flip(table: "inodes", value: row.sealed, where: "id = 1")
        }

        let r = try fx.check()
        #expect(has(r, .rootDamaged, path: "/"), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let data = try fx.contents("/f.txt")
        #expect(data == b("data"))
    }

    @Test func progressCountsUpToTheTotal() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        var g = SplitMix64(seed: 6)
        for i in 0..<20 { try fx.file("f\(i)", g.bytes(3 * Self.chunk)) }
        fx.unmount()
        var calls: [(done: Int, total: Int)] = []
        let store = try EntityStore.open(at: fx.storePath, keys: fx.keys, readOnly: true)
        defer { store.close() }
        let r = try Checker(store: store, chunkSize: Self.chunk, progress: { calls.append(($0, $1)) }).run()
        #expect(r.isClean, "\(kinds(r))")
        let last = try required(calls.last)
        #expect(last.done == last.total)
        #expect(last.total == 21 + 20 + Checker.chunkWeight * 60, "inodes, entries and weighted chunks")
        var previous = 0, ordered = true
        for c in calls {
            if c.done < previous { ordered = false }
            previous = c.done
        }
        #expect(ordered, "progress never goes back")
        #expect(calls.count > 60, "one report per row at least")
    }

    @Test func entryTypeMismatchIsRewrittenAndAnExtraDirectoryLinkDropped() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let f = try fx.file("f.txt", b("data"))
        let d = try fx.mkdir("d")
        fx.unmount()
        try fx.edit { s in
            try s.putEntry(parent: rootIno, DirectoryEntryRecord(name: b("f.txt"), ino: f, type: UInt32(S_IFLNK)))
            // A second name for the directory, with the wrong type too: it goes, and is not rewritten back.
            try s.putEntry(parent: rootIno, DirectoryEntryRecord(name: b("zz"), ino: d, type: UInt32(S_IFREG)))
        }

        let r = try fx.check()
        #expect(has(r, .entryTypeMismatch, path: "/f.txt", inode: f), "\(kinds(r))")
        #expect(has(r, .directoryLinkedTwice, path: "/zz", inode: d), "\(kinds(r))")
        try fx.repairAndRecheck(r)
        try fx.mount()
        let fs = try fx.mounted
        let h = try fs.opendir(rootIno, caller: caller)
        defer { fs.releasedir(rootIno, handle: h) }
        let entries = try fs.readdir(rootIno, handle: h, offset: 0, limit: 100, plus: false)
        let types = Dictionary(uniqueKeysWithValues: entries.map { (String(decoding: $0.name, as: UTF8.self), $0.type) })
        #expect(types["f.txt"] == UInt32(S_IFREG))
        #expect(types["zz"] == nil)
        #expect(types["d"] == UInt32(S_IFDIR))
    }

    @Test func lostAndFoundNamesFitAndDoNotCollide() {
        let plain = Repairer.uniqueName(hint: nil, ino: 42, taken: [])
        #expect(plain == b("#42"))
        let kept = Repairer.uniqueName(hint: b("report.pdf"), ino: 42, taken: [])
        #expect(kept == b("report.pdf#42"))
        let long = Repairer.uniqueName(hint: [UInt8](repeating: 0x61, count: 255), ino: 42, taken: [])
        #expect(long.count == 255)
        #expect(long.suffix(3) == b("#42")[...])
        let second = Repairer.uniqueName(hint: b("report.pdf"), ino: 42, taken: [b("report.pdf#42")])
        #expect(second == b("report.pdf#42.1"))
    }

    @Test func fileUnlinkedWhileOpenIsLeftToTheNextMount() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let fs = try fx.mounted
        let (attr, open) = try fs.create(parent: rootIno, name: b("tmp"), mode: 0o600, flags: O_RDWR, caller: caller)
        _ = try b("scratch").withUnsafeBytes { try fs.write(attr.ino, handle: open.handle, offset: 0, data: $0) }
        try fs.unlink(parent: rootIno, name: b("tmp"))
        try fx.crash()

        let r = try fx.check()
        #expect(r.isClean, "an orphan the next mount removes is not a problem: \(kinds(r))")
        #expect(r.counts.chunks == 1, "its content is still there and owned")
    }

    @Test func sparseFileFarBeyondItsDataChecksAndRepairs() throws {
        let fx = try CheckFixture()
        defer { fx.cleanup() }
        let far = UInt64(3000 * Self.chunk)
        let ino = try fx.file("sparse.bin", b("head"))
        try fx.write("/sparse.bin", at: far, b("tail"))
        try fx.write("/sparse.bin", at: UInt64(20 * Self.chunk), b("middle"))
        fx.unmount()
        let clean = try fx.check()
        #expect(clean.isClean, "pages 0 and 2 only: \(kinds(clean))")
        #expect(clean.counts.chunkMapPages == 2)

        let file = try required(try fx.edit { try $0.inode(ino)?.contentId })
        try fx.edit { try $0.execute("DELETE FROM chunks WHERE file = \(Int64(bitPattern: file)) AND idx = 3000") }
        let r = try fx.check()
        #expect(has(r, .chunkMissing, path: "/sparse.bin", inode: ino), "\(kinds(r))")
        let summary = try fx.repairAndRecheck(r)
        #expect(summary.lostRanges.first?.ranges == [far..<far + 4])
        try fx.mount()
        let read = try fx.contents("/sparse.bin")
        var expected = [UInt8](repeating: 0, count: Int(far) + 4)
        expected.replaceSubrange(0..<4, with: b("head"))
        expected.replaceSubrange(20 * Self.chunk..<20 * Self.chunk + 6, with: b("middle"))
        #expect(read == expected)
    }
}
