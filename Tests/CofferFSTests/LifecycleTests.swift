import Foundation
import Glibc
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

@Suite("Open files, orphans, persistence, read-only")
struct LifecycleTests {
    @Test func unlinkedOpenFileLivesUntilRelease() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("tmp")
        try f.write(ino, h, at: 0, [UInt8](repeating: 1, count: 10_000))
        try f.fs.setxattr(ino, name: b("user.k"), value: b("v"), flags: 0)
        let cid = try #require(f.contentId(ino))
        try f.fs.unlink(parent: root, name: b("tmp"))
        expectError(FSError.notFound) { _ = try f.fs.lookup(parent: root, name: b("tmp")) }
        #expect(try f.list().isEmpty)
        #expect(try f.fs.getattr(ino).nlink == 0)
        // Still readable and writable by inode (as the kernel holding it reads and writes).
        #expect(try f.fs.read(ino, handle: h, offset: 9_998, size: 10) == [1, 1])
        try f.write(ino, h, at: 10_000, b("more"))
        #expect(try f.fs.read(ino, handle: h, offset: 9_999, size: 10) == [1] + b("more"))
        // The orphan row goes out with the record at the next commit (rm's forget mostly comes first).
        #expect(try f.store.orphans().isEmpty)
        try f.fs.commit()
        #expect(try f.store.orphans() == [ino])
        #expect(try f.store.chunkIndices(file: cid) == [0, 1, 2])
        // Opening and closing again changes nothing: the kernel's lookup holds it.
        let h2 = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        f.fs.release(ino, handle: h)
        #expect(try f.fs.read(ino, handle: h2, offset: 0, size: 1) == [1])
        #expect(try f.store.inode(ino) != nil)
        f.fs.release(ino, handle: h2)
        // The kernel still holds it (another process may read it without a handle).
        #expect(try f.fs.read(ino, handle: .none, offset: 0, size: 1) == [1])
        #expect(try f.store.orphans() == [ino])
        // Gone with the kernel's forget: inode, chunks, xattrs, orphan row.
        f.fs.forget(ino, lookups: 1)
        #expect(try f.leftovers(ino, content: cid).isEmpty)
        #expect(try f.store.orphans().isEmpty)
        expectError(FSError.notFound) { _ = try f.fs.getattr(ino) }
        #expect(try f.store.counts().inodes == 1, "only the root is left")
    }

    @Test func renameOverAnOpenFileKeepsItUntilRelease() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let victim = try f.file("victim", b("old data"))
        let h = try f.fs.open(victim, flags: O_RDONLY, caller: caller).handle
        try f.file("new", b("new data"))
        try f.fs.rename(parent: root, name: b("new"), newParent: root, newName: b("victim"), flags: [])
        #expect(try f.fs.read(victim, handle: h, offset: 0, size: 100) == b("old data"))
        try f.fs.commit()
        #expect(try f.store.orphans() == [victim])
        f.fs.release(victim, handle: h)
        #expect(try f.store.orphans() == [victim], "the kernel still holds it")
        f.fs.forget(victim, lookups: .max)
        #expect(try f.store.inode(victim) == nil)
        #expect(try f.store.orphans().isEmpty)
        #expect(try f.contents(try f.ino("victim")) == b("new data"))
    }

    @Test func readAndWriteWithoutAHandle() throws {
        // What the kernel sends once OPEN got ENOSYS: reads and writes carrying HandleID.none.
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let ino = try f.file("plain", b("0123456789"))
        #expect(f.fs.opensWithoutHandles)
        #expect(try f.fs.read(ino, handle: .none, offset: 2, size: 3) == b("234"))
        // No O_APPEND is assumed: the kernel has placed append writes already.
        try f.write(ino, .none, at: 4, b("ab"))
        try f.write(ino, .none, at: 9_000, b("end"))
        #expect(try f.fs.getattr(ino).size == 9_003)
        #expect(try f.fs.read(ino, handle: .none, offset: 0, size: 12) == b("0123ab6789") + [0, 0])
        #expect(try f.fs.read(ino, handle: .none, offset: 9_000, size: 10) == b("end"))
        // A handle that was never given out is still refused.
        expectError(FSError.badHandle) { _ = try f.fs.read(ino, handle: 987_654, offset: 0, size: 1) }
        // Unlinked while the kernel holds it: readable without a handle until the forget.
        let cid = try #require(f.contentId(ino))
        try f.fs.unlink(parent: root, name: b("plain"))
        #expect(try f.fs.read(ino, handle: .none, offset: 9_000, size: 10) == b("end"))
        f.fs.forget(ino, lookups: .max)
        #expect(try f.leftovers(ino, content: cid).isEmpty)
    }

    /// Under the committer, a forget leaves a removed file's rows to quiet moments; until they are
    /// gone, commits write the inode with an orphan row, so a crash in between loses nothing and leaks nothing.
    @Test func removedFilesAreReapedWhenQuiet() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        f.fs.meta.withLock { f.fs.reapsWhenQuiet = true }  // what startCommitter sets
        let keep = try f.file("keep", b("keep me"))
        var doomed: [(ino: InodeNumber, cid: UInt64)] = []
        for i in 0..<20 {
            let ino = try f.file("doomed-\(i)", [UInt8](repeating: UInt8(i), count: 9000))
            try f.fs.setxattr(ino, name: b("user.x"), value: b("y"), flags: 0)
            doomed.append((ino, try #require(f.contentId(ino))))
        }
        try f.fs.commit()
        for (i, d) in doomed.enumerated() {
            try f.fs.unlink(parent: root, name: b("doomed-\(i)"))
            f.fs.forget(d.ino, lookups: 1)
        }
        // The forgets returned without deleting: the rows wait, and no lookup finds the names.
        #expect(f.fs.meta.withLock { f.fs.dying.count } == 20)
        #expect(try f.store.chunkIndices(file: doomed[0].cid).count == 3)
        #expect(try f.list() == ["keep"])
        // A commit now writes them as orphans.
        try f.fs.commit()
        #expect(Set(try f.store.orphans()) == Set(doomed.map(\.ino)))
        // Forgets still coming: no reaping; after a quiet interval, everything goes.
        f.fs.reapIfQuiet()
        #expect(f.fs.meta.withLock { f.fs.dying.count } == 20, "a forget came since the last look")
        f.fs.reapIfQuiet()
        #expect(f.fs.meta.withLock { f.fs.dying.isEmpty })
        try f.fs.commit()
        for d in doomed { #expect(try f.leftovers(d.ino, content: d.cid).isEmpty) }
        #expect(try f.store.orphans().isEmpty)
        #expect(try f.contents(keep) == b("keep me"))
    }

    @Test func aCrashBeforeReapingLeavesOrphansTheNextMountRemoves() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, cid) = try f.dyingFile("doomed")
        try f.crashAndRemount()  // commits first: the dying inode goes out as an orphan
        #expect(try f.leftovers(ino, content: cid).isEmpty, "the orphan is removed at mount")
        #expect(try f.list().isEmpty)
        // And at a clean unmount every dying inode is reaped before the last commit.
        let (other, otherCid) = try f.dyingFile("other")
        try f.remount()
        #expect(try f.leftovers(other, content: otherCid).isEmpty)
    }

    /// A store error while reaping (here a temporary trigger on the writer connection) keeps the inodes
    /// dying: the next commit writes them with orphan rows, and a later reap deletes them.
    @Test func aFailedReapKeepsItsInodesForLater() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        let (ino, cid) = try f.dyingFile("doomed")
        try f.store.sqlite.writer { db in
            try db.execute(sql: "CREATE TEMP TRIGGER no_delete BEFORE DELETE ON inodes BEGIN SELECT RAISE(FAIL, 'injected'); END")
        }
        #expect(f.fs.reapSome() == -1)
        #expect(f.fs.meta.withLock { f.fs.dying.keys.sorted() } == [ino], "a failed piece stays dying")
        try f.store.sqlite.writer { db in try db.execute(sql: "DROP TRIGGER no_delete") }
        try f.fs.commit()
        #expect(try f.store.orphans() == [ino], "written with its orphan row")
        f.fs.reapAll()
        try f.fs.commit()
        #expect(try f.leftovers(ino, content: cid).isEmpty)
        #expect(f.fs.meta.withLock { f.fs.dying.isEmpty })
    }

    /// An orphan that cannot be deleted at mount (here a temporary trigger on the new writer; in the field
    /// a full disk) does not refuse the mount: every other file is there, the orphan stays with its row,
    /// and the next mount removes it.
    @Test func anOrphanThatCannotBeRemovedDoesNotRefuseTheMount() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        let keep = try f.file("keep", b("keep me"))
        let (ino, cid) = try f.dyingFile("doomed")
        try f.crashAndRemount { store in
            try store.sqlite.writer { db in
                try db.execute(sql: "CREATE TEMP TRIGGER no_delete BEFORE DELETE ON inodes BEGIN SELECT RAISE(FAIL, 'injected'); END")
            }
        }
        #expect(try f.list() == ["keep"])
        #expect(try f.contents(keep) == b("keep me"))
        #expect(try f.store.orphans() == [ino])
        #expect(try f.store.inode(ino) != nil)
        try f.remount()
        #expect(try f.leftovers(ino, content: cid).isEmpty, "the orphan is removed at the next mount")
        #expect(try f.contents(keep) == b("keep me"))
    }

    /// A dropped transaction (a full disk) takes an uncommitted unlink with it: the dying inode is a file
    /// again and must not be reaped; one unlinked in a commit before stays dying.
    @Test func aDroppedTransactionGivesBackADyingFile() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        f.fs.meta.withLock { f.fs.reapsWhenQuiet = true }
        let kept = try f.file("kept", [UInt8](repeating: 1, count: 9000))
        let gone = try f.file("gone", [UInt8](repeating: 2, count: 9000))
        try f.fs.commit()
        try f.fs.unlink(parent: root, name: b("gone"))
        f.fs.forget(gone, lookups: 1)
        try f.fs.commit()  // "gone" is committed as an orphan
        try f.fs.unlink(parent: root, name: b("kept"))
        f.fs.forget(kept, lookups: 1)
        #expect(f.fs.meta.withLock { f.fs.dying.count } == 2)
        // The store drops the open transaction, as on SQLITE_FULL.
        try f.store.sqlite.writer { db in try db.execute(sql: "ROLLBACK") }
        f.store.onRollback?(.diskFull)
        #expect(try f.list() == ["kept"], "the lost unlink's entry is back")
        #expect(f.fs.meta.withLock { f.fs.dying.keys.sorted() } == [gone])
        f.fs.reapAll()
        try f.fs.commit()
        #expect(try f.contents(try f.ino("kept")) == [UInt8](repeating: 1, count: 9000))
        #expect(try f.store.inode(gone) == nil)
        #expect(try f.store.orphans().isEmpty)
    }

    /// A file created in a dropped transaction is gone, though the kernel still holds it (a cached name): opening
    /// or reading it fails, never gives bytes that are not its own (its size said 4 and a read gave 4 zeros), and
    /// an fsync through a handle still open fails every time (the second returned 0 and the file was lost).
    @Test func aFileCreatedInADroppedTransactionReadsAsGone() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        try f.fs.commit()
        let lost = try f.file("lost", b("one\n"))  // created, written and released; the kernel keeps its lookup
        let (held, h) = try f.create("held")  // still open: its fsync must never say it is durable
        try f.write(held, h, at: 0, [UInt8](repeating: 7, count: 3000))
        try f.store.sqlite.writer { db in try db.execute(sql: "ROLLBACK") }
        f.store.onRollback?(.diskFull)
        expectError(FSError.noSpace) { try f.fs.fsync(held, handle: h, dataOnly: false) }
        expectError(FSError(ESTALE)) { try f.fs.fsync(held, handle: h, dataOnly: false) }
        #expect(try f.list().isEmpty, "the lost file's entry is gone")
        expectError(FSError(ESTALE)) { _ = try f.fs.open(lost, flags: O_RDONLY, caller: caller) }
        expectError(FSError(ESTALE)) { _ = try f.fs.getattr(lost) }
    }

    /// A directory made in a group that was then dropped, and forgotten by the kernel before the drop, counts in
    /// the unmount's warning as a file does: no fsyncdir can report its loss any more (only files counted).
    @Test func aDroppedGroupsForgottenDirectoriesAreInTheUnmountWarning() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        try f.fs.commit()
        let dir = try f.mkdir("d")
        let file = try f.file("f", b("lost"))
        f.fs.forget(dir, lookups: 1)
        f.fs.forget(file, lookups: 1)
        try f.store.sqlite.writer { db in try db.execute(sql: "ROLLBACK") }
        f.store.onRollback?(.diskFull)
        #expect(try f.list().isEmpty, "the dropped group's names are gone")
        let losses = f.fs.meta.withLock { f.fs.unheardLosses }
        #expect(losses.contains(dir) && losses.contains(file), "\(losses) holds the directory and the file")
        let mounted = f.fs
        try f.remount()
        #expect(
            mounted.unmountWarning?.contains("changes to \(losses.count) file(s) or directories") == true, "\(mounted.unmountWarning ?? "no warning")"
        )
    }

    @Test func orphanOfACrashIsRemovedAtTheNextMount() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let keep = try f.file("keep", b("keep me"))
        let (ino, h) = try f.create("doomed")
        try f.write(ino, h, at: 0, [UInt8](repeating: 2, count: 9000))
        try f.fs.setxattr(ino, name: b("user.x"), value: b("y"), flags: 0)
        let cid = try #require(f.contentId(ino))
        try f.fs.unlink(parent: root, name: b("doomed"))
        try f.fs.commit()
        #expect(try f.store.orphans() == [ino])
        _ = h  // never released: the daemon "dies" here
        try f.crashAndRemount()
        #expect(try f.leftovers(ino, content: cid).isEmpty, "the orphan is removed at mount")
        #expect(try f.contents(keep) == b("keep me"))
        #expect(try f.list() == ["keep"])
        // Durable: a further mount sees the same.
        try f.remount()
        #expect(try f.store.inode(ino) == nil)
        #expect(try f.store.counts().inodes == 2)
    }

    @Test func uncommittedWorkIsLostInACrashCommittedWorkIsNot() throws {
        var options = CofferFileSystem.Options()
        options.commitInterval = .seconds(3600)
        let f = try Fixture(options: options, engine: .sqlite)
        defer { f.cleanup() }
        let synced = try f.file("synced", b("durable"))
        try f.fs.fsync(synced, handle: nil, dataOnly: false)
        let store = f.store
        // Copy the store files while uncommitted changes sit in the open transaction (a power cut).
        try f.file("unsynced", b("volatile"))
        let crashDir = f.dir + "/crash"
        try FileManager.default.createDirectory(atPath: crashDir, withIntermediateDirectories: false)
        for s in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: f.storePath + s) {
            try FileManager.default.copyItem(atPath: f.storePath + s, toPath: crashDir + "/" + SQLiteBackend.fileName + s)
        }
        let crashed = try EntityStore.open(at: crashDir + "/" + SQLiteBackend.fileName, keys: f.keys)
        let fs2 = try CofferFileSystem(store: crashed, chunkSize: f.chunkSize, options: .init(), statfsPath: crashDir, logger: .init(label: "crash"))
        defer { fs2.shutdown() }
        #expect(try fs2.lookup(parent: root, name: b("synced")).size == 7)
        expectError(FSError.notFound) { _ = try fs2.lookup(parent: root, name: b("unsynced")) }
        #expect(store.hasPendingChanges, "the unsynced file was still uncommitted when copied")
        #expect(crashed.generation == store.generation)
    }

    @Test func persistenceAcrossShutdownAndRemount() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let d = try f.mkdir("docs")
        let sub = try f.mkdir("deep", in: d)
        let file = try f.file("note.txt", in: sub, b("remember"))
        _ = try f.fs.setattr(
            file, changes: AttributeChanges(mode: 0o600, mtime: .set(Timestamp(seconds: 1234, nanoseconds: 5678))), handle: nil, caller: caller)
        _ = try f.fs.symlink(parent: d, name: b("link"), target: b("deep/note.txt"), caller: caller)
        _ = try f.fs.link(file, newParent: root, newName: b("hard"))
        try f.fs.setxattr(file, name: b("user.tag"), value: b("red"), flags: 0)
        // Dirty in memory only (no explicit commit): shutdown must write it.
        let generation = f.store.generation
        try f.remount()
        #expect(f.store.generation > generation)
        #expect(Set(try f.list()) == ["docs", "hard"])
        #expect(Set(try f.list(d)) == ["deep", "link"])
        let a = try f.fs.getattr(file)
        #expect(a.mode == UInt32(S_IFREG) | 0o600)
        #expect(a.mtime == Timestamp(seconds: 1234, nanoseconds: 5678))
        #expect(a.nlink == 2)
        #expect(a.size == 8)
        #expect(try f.contents(try f.ino("hard")) == b("remember"))
        #expect(try f.fs.readlink(try f.ino("link", in: d)) == b("deep/note.txt"))
        #expect(try f.fs.getxattr(file, name: b("user.tag")) == b("red"))
        #expect(try f.fs.getattr(d).nlink == 3)
        #expect(try f.fs.getattr(root).nlink == 3)
    }

    @Test func readOnlyModeRefusesEveryMutation() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let file = try f.file("f", b("data"))
        let d = try f.mkdir("d")
        try f.fs.setxattr(file, name: b("user.a"), value: b("1"), flags: 0)
        var options = CofferFileSystem.Options()
        options.readOnly = true
        try f.remount(options: options)
        let fs = f.fs
        #expect(fs.isReadOnly)
        let erofs: [(String, () throws -> Void)] = [
            ("create", { _ = try fs.create(parent: root, name: b("n"), mode: 0o644, flags: O_RDWR, caller: caller) }),
            ("mkdir", { _ = try fs.mkdir(parent: root, name: b("n"), mode: 0o755, caller: caller) }),
            ("mknod", { _ = try fs.mknod(parent: root, name: b("n"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0, caller: caller) }),
            ("symlink", { _ = try fs.symlink(parent: root, name: b("n"), target: b("/x"), caller: caller) }),
            ("link", { _ = try fs.link(file, newParent: root, newName: b("n")) }),
            ("unlink", { try fs.unlink(parent: root, name: b("f")) }),
            ("rmdir", { try fs.rmdir(parent: root, name: b("d")) }),
            ("rename", { try fs.rename(parent: root, name: b("f"), newParent: root, newName: b("g"), flags: []) }),
            ("setattr mode", { _ = try fs.setattr(file, changes: AttributeChanges(mode: 0o600), handle: nil, caller: caller) }),
            ("setattr size", { _ = try fs.setattr(file, changes: AttributeChanges(size: 0), handle: nil, caller: caller) }),
            ("setattr times", { _ = try fs.setattr(file, changes: AttributeChanges(mtime: .now), handle: nil, caller: caller) }),
            ("setxattr", { try fs.setxattr(file, name: b("user.b"), value: b("2"), flags: 0) }),
            ("removexattr", { try fs.removexattr(file, name: b("user.a")) }),
            ("open for writing", { _ = try fs.open(file, flags: O_WRONLY, caller: caller) }),
            ("open O_RDWR", { _ = try fs.open(file, flags: O_RDWR, caller: caller) }),
            ("open O_TRUNC", { _ = try fs.open(file, flags: O_RDONLY | O_TRUNC, caller: caller) })
        ]
        for (what, op) in erofs {
            #expect(fsError(op) == .readOnly, "\(what)")
        }
        // A handle opened for reading cannot write either.
        let h = try fs.open(file, flags: O_RDONLY, caller: caller).handle
        expectError(FSError.readOnly) { _ = try f.write(file, h, at: 0, b("x")) }
        expectError(FSError.readOnly) { try fs.fallocate(file, handle: h, mode: 0, offset: 0, length: 100) }
        #expect(try fs.read(file, handle: h, offset: 0, size: 10) == b("data"))
        fs.release(file, handle: h)
        // Reads work, nothing changed.
        #expect(Set(try f.list()) == ["f", "d"])
        #expect(try fs.getxattr(file, name: b("user.a")) == b("1"))
        #expect(try fs.getattr(d).nlink == 2)
        try fs.fsync(file, handle: nil, dataOnly: false)  // a no-op, not an error
        try f.remount()
        #expect(try f.contents(file) == b("data"))
    }
}

extension Fixture {
    /// A committed 9,000-byte file, then unlinked and forgotten under the committer's policy: dying, its
    /// rows (inode, three chunks) still in the store.
    func dyingFile(_ name: String) throws -> (ino: InodeNumber, cid: UInt64) {
        fs.meta.withLock { fs.reapsWhenQuiet = true }  // what startCommitter sets
        let ino = try file(name, [UInt8](repeating: 7, count: 9000))
        let cid = try #require(contentId(ino))
        try fs.commit()
        try fs.unlink(parent: root, name: b(name))
        fs.forget(ino, lookups: 1)
        #expect(fs.meta.withLock { fs.dying[ino] != nil })
        return (ino, cid)
    }
}
