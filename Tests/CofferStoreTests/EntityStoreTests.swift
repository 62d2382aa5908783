import CofferCrypto
import Foundation
import GRDB
import CofferTestSupport
import Synchronization
import Testing
@testable import CofferStore
import CofferStoreTestSupport

@Suite("Entity store")
struct EntityStoreTests {
    @Test(arguments: StoreEngine.allCases) func inodesPutGetDelete(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            let root = try #require(try store.inode(EntityStore.rootInode))
            #expect(root.mode == 0o040755 && root.nlink == 2)
            #expect(try store.inode(12345) == nil)
            let rec = sampleInode(size: 99, contentId: 77, target: .relative(b("a/b")))
            try store.putInode(12345, rec)
            #expect(try store.inode(12345) == rec)
            var changed = rec
            changed.size = 100
            try store.putInode(12345, changed)
            #expect(try store.inode(12345) == changed)
            try store.putInode(UInt64.max, rec)  // the full 64-bit range maps onto SQLite's signed integers
            #expect(try store.inode(UInt64.max) == rec)
            try store.deleteInode(12345)
            #expect(try store.inode(12345) == nil)
            for _ in 0..<50 {
                let id = try store.newInodeId()
                #expect(id > 1 && id <= UInt64(Int64.max))
                #expect((try EntityStore.newContentId()) & 1 == 1)  // never 0
            }
        }
    }

    /// The entries of several directories in one call (a search below a moved directory): each directory's
    /// own, none for one without entries, within and outside an open group.
    @Test(arguments: StoreEngine.allCases) func entriesOfSeveralDirectoriesInOneCall(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            for (d, names) in [(10, ["a", "b"]), (11, ["c"]), (12, [])] as [(UInt64, [String])] {
                for (i, n) in names.enumerated() {
                    try store.putEntry(parent: d, DirectoryEntryRecord(name: b(n), ino: d * 100 + UInt64(i), type: 0o040000))
                }
            }
            func names(_ got: [UInt64: [DirectoryEntryRecord]]) -> [UInt64: [String]] {
                got.mapValues { $0.map { String(decoding: $0.name, as: UTF8.self) }.sorted() }
            }
            #expect(names(try store.entries(parents: [12, 10, 11])) == [10: ["a", "b"], 11: ["c"], 12: []])
            try store.commit()
            #expect(names(try store.entries(parents: [11, 10])) == [10: ["a", "b"], 11: ["c"]])
            #expect(try store.entries(parents: []).isEmpty)
        }
    }

    /// A page of inodes read in one call (readdirplus): every existing id, with the full 64-bit range,
    /// none that does not exist, and a row that does not open left out rather than failing the rest.
    @Test(arguments: StoreEngine.allCases) func inodesReadInOneCall(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            var wanted: [UInt64: InodeRecord] = [:]
            for (i, id) in [UInt64(2), 1 << 40, UInt64(Int64.max), UInt64.max].enumerated() {
                let rec = sampleInode(size: UInt64(i * 1000), contentId: UInt64(2 * i + 1), target: nil)
                try store.putInode(id, rec)
                wanted[id] = rec
            }
            try store.putInode(77, sampleInode(size: 7, contentId: 7, target: nil))
            try store.backend.putInode(77, sealed: [UInt8](repeating: 0xAB, count: 60))  // damaged
            #expect(try store.inodes([]).isEmpty)
            let got = try store.inodes(Array(wanted.keys) + [77, 12345])
            #expect(got == wanted)
            try store.commit(durable: false)
            #expect(try store.inodes(Array(wanted.keys)) == wanted)
        }
    }

    @Test(arguments: StoreEngine.allCases) func directoryEntries(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            #expect(try store.hasEntries(parent: 1) == false)
            #expect(try store.entries(parent: 1).isEmpty)
            let names = (0..<20).map { b("name-\($0)") } + [[UInt8](repeating: 0xE2, count: 255)]
            for (i, n) in names.enumerated() {
                try store.putEntry(parent: 1, DirectoryEntryRecord(name: n, ino: UInt64(100 + i), type: 0o100000))
            }
            try store.putEntry(parent: 7, DirectoryEntryRecord(name: b("name-0"), ino: 5, type: 0o040000))
            #expect(try store.hasEntries(parent: 1))
            #expect(try store.entry(parent: 1, name: b("name-3"))?.ino == 103)
            #expect(try store.entry(parent: 7, name: b("name-0"))?.ino == 5)
            #expect(try store.entry(parent: 1, name: b("missing")) == nil)
            #expect(try store.entry(parent: 2, name: b("name-3")) == nil)
            let listed = try store.entries(parent: 1)
            #expect(Set(listed.map(\.name)) == Set(names))
            #expect(listed.count == names.count)
            // Replacing an entry keeps one row.
            try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("name-3"), ino: 999, type: 0o120000))
            #expect(try store.entry(parent: 1, name: b("name-3")) == DirectoryEntryRecord(name: b("name-3"), ino: 999, type: 0o120000))
            #expect(try store.entries(parent: 1).count == names.count)
            try store.deleteEntry(parent: 1, name: b("name-3"))
            #expect(try store.entry(parent: 1, name: b("name-3")) == nil)
            #expect(try store.entries(parent: 1).count == names.count - 1)
            #expect(try store.counts().entries == names.count)  // 20 left in 1, plus one in 7
        }
    }

    /// SQLite may end the group transaction by itself (a full disk, an I/O error; here RAISE(ROLLBACK)
    /// from a trigger). Inside a batch, the body's error used to be kept aside, so nobody noticed:
    /// the filesystem went on as if its changes were still pending, and the next commit would have
    /// committed half of them. Now every path hears of it.
    @Test func aTransactionSQLiteDropsInsideABatchIsNoticed() throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(in: dir)
            defer { store.close() }
            let rollbacks = Mutex(0)
            store.onRollback = { _ in rollbacks.withLock { $0 += 1 } }
            try store.sqlite.writer { db in
                try db.execute(sql: "CREATE TEMP TRIGGER refuse BEFORE INSERT ON dirents BEGIN SELECT RAISE(ROLLBACK, 'injected'); END")
            }
            #expect(throws: StoreError.self) {
                try store.batch {
                    try store.putInode(5, sampleInode(size: 1))
                    try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("doomed"), ino: 5, type: 0o100000))
                }
            }
            #expect(rollbacks.withLock { $0 } == 1, "the dropped transaction is reported")
            #expect(!store.hasPendingChanges)
            #expect(try store.inode(5) == nil, "the inode went with the transaction")
            // The next change starts a new group and commits alone.
            try store.sqlite.writer { db in try db.execute(sql: "DROP TRIGGER refuse") }
            try store.batch { try store.putInode(6, sampleInode(size: 2)) }
            try store.commit()
            #expect(try store.inode(6)?.size == 2)
        }
    }

    /// A file's chunk rows go in pieces (`deletePiece`); a piece that fails after others succeeded drops
    /// the whole group, so no commit can name rows the earlier pieces deleted. One that fails first
    /// leaves the group as it was. RAISE(ABORT) undoes its statement and keeps the transaction, as SQLite
    /// may do on a full disk.
    @Test func aDeleteThatFailsPartWayDropsTheGroup() throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(in: dir)
            defer { store.close() }
            let rollbacks = Mutex(0)
            store.onRollback = { _ in rollbacks.withLock { $0 += 1 } }
            let file = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: file)
            let count = SQLiteBackend.deletePiece + 100
            try store.batch {
                for i in 0..<count { try store.putChunk(file: file, index: UInt64(i), sealed: try cipher.seal([1], index: UInt64(i))) }
            }
            try store.commit()
            // In the first piece: nothing was deleted, the group goes on.
            try store.sqlite.writer { db in
                try db.execute(sql: "CREATE TEMP TRIGGER refuse BEFORE DELETE ON chunks WHEN old.idx = 5 BEGIN SELECT RAISE(ABORT, 'injected'); END")
            }
            try store.batch { try store.putInode(7, sampleInode(size: 7)) }
            #expect((try? store.deleteChunks(file: file)) == nil, "the delete fails")
            #expect(rollbacks.withLock { $0 } == 0)
            #expect(store.hasPendingChanges)
            try store.sqlite.writer { db in try db.execute(sql: "DROP TRIGGER refuse") }
            try store.commit()
            #expect(try store.inode(7)?.size == 7)
            // In the second piece: the first piece's deletes must not be committed.
            let second = SQLiteBackend.deletePiece + 50
            try store.sqlite.writer { db in
                try db.execute(
                    sql: "CREATE TEMP TRIGGER refuse BEFORE DELETE ON chunks WHEN old.idx = \(second) BEGIN SELECT RAISE(ABORT, 'injected'); END")
            }
            #expect((try? store.deleteChunks(file: file)) == nil, "the delete fails")
            #expect(rollbacks.withLock { $0 } == 1, "the dropped group is reported")
            #expect(!store.hasPendingChanges)
            try store.sqlite.writer { db in try db.execute(sql: "DROP TRIGGER refuse") }
            try store.commit()
            #expect(try store.chunkIndices(file: file).count == count, "every row is still there")
            #expect(try store.deleteChunks(file: file) == count)
            try store.commit()
            #expect(try store.chunkIndices(file: file).isEmpty)
        }
    }

    /// A checkpoint forced by the WAL's size while the writer is busy leaves the WAL file at its largest; once
    /// the writer is quiet the file is cut, though nothing was committed after (issue 19: 5 s after a 1 GiB
    /// write the container sometimes still held it twice).
    @Test func aWALFoldedWhileBusyIsCutOnceQuiet() throws {
        try withTempDir { dir in
            let path = dir + "/w.db"
            let q = try DatabaseQueue(path: path)
            try q.writeWithoutTransaction { db in
                _ = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
                try db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
                try db.execute(sql: "CREATE TABLE t(v BLOB)")
            }
            func walSize() -> Int64 {
                var st = stat()
                return stat(path + "-wal", &st) == 0 ? Int64(st.st_size) : -1
            }
            let checkpointer = Checkpointer(path: path, idle: .seconds(1), limit: 1 << 20)
            defer { checkpointer.stop() }
            try q.write { db in
                for _ in 0..<64 { try db.execute(sql: "INSERT INTO t VALUES (zeroblob(65536))") }
            }
            #expect(walSize() > 4 << 20, "the commit went to the WAL")
            checkpointer.committed()  // over the limit: folded at once, while the writer counts as busy
            let deadline = ContinuousClock.now + .seconds(10)
            while walSize() != 0 && ContinuousClock.now < deadline { usleep(50_000) }
            #expect(walSize() == 0, "the WAL is cut once the writer is quiet")
            #expect(try q.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM t") } == 64)
        }
    }

    /// While mounted and quiet, the WAL is folded in and cut to nothing, so the container holds about
    /// what it stores (issue 19: after an untar it held the tree twice until unmount).
    @Test func aQuietStoreCutsItsWALToNothing() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segmentThreshold = .max  // content in rows: this is about the WAL
            defer { store.close() }
            let file = try EntityStore.newContentId()
            try store.putTestChunks(file: file, count: 64, seed: 3, keys: keys)  // 4 MiB
            try store.commit()
            func walSize() -> Int64 {
                var st = stat()
                return stat(path + "-wal", &st) == 0 ? Int64(st.st_size) : -1
            }
            #expect(walSize() > 4 << 20, "the commit went to the WAL")
            let deadline = ContinuousClock.now + .seconds(10)
            while walSize() != 0 && ContinuousClock.now < deadline { usleep(50_000) }
            #expect(walSize() == 0, "the WAL is cut once the store is quiet")
            #expect(try store.chunkIndices(file: file).count == 64)
            // Writing goes on as before.
            try store.putInode(70, sampleInode(size: 1))
            try store.commit()
            #expect(try store.inode(70)?.size == 1)
        }
    }

    /// A hostile store puts a value that is no blob (an integer) into an entry and an xattr row: the
    /// row is reported damaged and keeps its place, instead of being skipped (hidden) or trapping
    /// GRDB's conversion.
    @Test func nonBlobValuesAreReportedNotHidden() throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(in: dir)
            defer { store.close() }
            try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("good"), ino: 5, type: 0o100000))
            try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("bad"), ino: 6, type: 0o100000))
            try store.putXattr(5, name: b("user.x"), value: b("v"))
            try store.commit()
            let badTag = store.nameTag(1, b("bad"))
            try store.sqlite.write { db in
                try db.execute(sql: "UPDATE dirents SET value = 42 WHERE tag = ?", arguments: [Data(badTag)])
                try db.execute(sql: "UPDATE xattrs SET value = 7")
            }
            var damaged: [StoreError] = []
            let page = try store.entryPage(parent: 1, from: [], limit: -1) { damaged.append($0) }
            #expect(page.count == 2, "the damaged entry keeps its place")
            #expect(page.first { $0.tag == badTag }?.record == nil)
            #expect(damaged.count == 1 && damaged.first?.authenticationFailureKind == .directoryEntry, "\(damaged)")
            #expect(try store.entries(parent: 1).map(\.name) == [b("good")])
            #expect(throws: StoreError.self) { _ = try store.xattrs(5) }
        }
    }

    /// A clean close leaves the store file alone: no WAL, no -shm, no space reserve for a sync tool to
    /// upload (issue 18). While open they exist; the store reopens from the one file.
    @Test func aCleanCloseLeavesOnlyTheStoreFile() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            try store.putInode(9, sampleInode(size: 3))
            try store.commit()
            let names = { (try? FileManager.default.contentsOfDirectory(atPath: dir).sorted()) ?? [] }
            #expect(names() == ["coffer.reserve", "store.db", "store.db-shm", "store.db-wal"], "while open")
            store.close()
            #expect(names() == ["store.db"])
            let reopened = try EntityStore.open(at: path, keys: keys, readOnly: true)
            defer { reopened.close() }
            #expect(try reopened.inode(9)?.size == 3)
        }
    }

    @Test(arguments: StoreEngine.allCases) func chunksSealStoreOpen(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, keys, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            let file = (try EntityStore.newContentId())
            let cipher = try store.contentCipher(contentId: file)
            let plain: [[UInt8]] = [[UInt8](repeating: 1, count: 4096), (0..<100).map { UInt8($0) }, []]
            var sealed: [(index: UInt64, sealed: [UInt8])] = []
            for (i, p) in plain.enumerated() {
                let index = UInt64(i) * 1000  // sparse indices
                sealed.append((index, try cipher.seal(p, index: index)))
            }
            try store.putChunks(file: file, sealed)
            #expect(try store.chunkIndices(file: file) == [0, 1000, 2000])
            let got = try store.sealedChunks(file: file, first: 0, last: 5000)
            #expect(got.map(\.index) == [0, 1000, 2000])
            for (i, c) in got.enumerated() {
                var out = [UInt8](repeating: 0xAA, count: 4096)
                let n = try out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index, into: $0) }
                #expect(Array(out.prefix(n)) == plain[i])
                // Bound to its index and its file.
                expectAuthFailure(.contentChunk) { _ = try out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index + 1, into: $0) } }
                expectAuthFailure(.contentChunk) {
                    _ = try out.withUnsafeMutableBytes {
                        try ContentCipher(contentId: file ^ 2, aead: keys.fileCipher(contentId: file), sealing: .blocks).open(
                            c.sealed, index: c.index, into: $0)
                    }
                }
                let otherFileCipher = ContentCipher(contentId: file, aead: try keys.fileCipher(contentId: file ^ 2), sealing: .blocks)
                expectAuthFailure(.contentChunk) {
                    _ = try out.withUnsafeMutableBytes { try otherFileCipher.open(c.sealed, index: c.index, into: $0) }
                }
            }
            // Range queries.
            #expect(try store.sealedChunks(file: file, first: 1, last: 1999).map(\.index) == [1000])
            #expect(try store.sealedChunks(file: file, first: 2001, last: UInt64(Int64.max)).isEmpty)
            #expect(try store.sealedChunks(file: file ^ 2, first: 0, last: 5000).isEmpty)
            // An output buffer too small for the chunk is refused, not overrun.
            var small = [UInt8](repeating: 0, count: 10)
            expectSomeError(StoreError.self) { _ = try small.withUnsafeMutableBytes { try cipher.open(got[0].sealed, index: 0, into: $0) } }
            // Deleting from an index.
            try store.deleteChunks(file: file, from: 1000)
            #expect(try store.chunkIndices(file: file) == [0])
            try store.putChunk(file: file, index: 5, sealed: sealed[0].sealed)
            try store.deleteChunks(file: file)
            #expect(try store.chunkIndices(file: file).isEmpty)
            // Reads after commit come from the reader pool.
            try store.putChunks(file: file, [sealed[0]])
            try store.commit()
            #expect(try store.sealedChunks(file: file, first: 0, last: 0).map(\.sealed) == [sealed[0].sealed])
        }
    }

    @Test(arguments: StoreEngine.allCases) func extendedAttributesAndOrphans(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            #expect(try store.xattr(1, name: b("user.a")) == nil)
            try store.putXattr(1, name: b("user.a"), value: b("one"))
            try store.putXattr(1, name: b("user.b"), value: [])
            try store.putXattr(2, name: b("user.a"), value: b("two"))
            #expect(try store.xattr(1, name: b("user.a")) == b("one"))
            #expect(try store.xattr(1, name: b("user.b")) == [])
            #expect(try store.xattr(2, name: b("user.a")) == b("two"))
            #expect(Set(try store.xattrs(1).map(\.name)) == [b("user.a"), b("user.b")])
            try store.putXattr(1, name: b("user.a"), value: b("uno"))
            #expect(try store.xattr(1, name: b("user.a")) == b("uno"))
            #expect(try store.deleteXattr(1, name: b("user.a")))
            #expect(try store.deleteXattr(1, name: b("user.a")) == false)
            try store.deleteXattrs(1)
            #expect(try store.xattrs(1).isEmpty)
            #expect(try store.xattr(2, name: b("user.a")) == b("two"))

            #expect(try store.orphans().isEmpty)
            try store.addOrphan(10)
            try store.addOrphan(10)
            try store.addOrphan(11)
            #expect(Set(try store.orphans()) == [10, 11])
            try store.removeOrphan(10)
            #expect(try store.orphans() == [11])
        }
    }

    @Test(arguments: StoreEngine.allCases) func commitBumpsGenerationAndPersists(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, made) = try makeStore(engine, in: dir)
            let g0 = store.generation
            #expect(g0 >= 1, "creating the store commits once")
            #expect(store.hasPendingChanges == false)
            try store.commit()
            #expect(store.generation == g0, "an empty commit must not bump the generation")
            try store.putInode(50, sampleInode())
            #expect(store.hasPendingChanges)
            try store.commit()
            #expect(store.generation == g0 + 1)
            #expect(store.hasPendingChanges == false)
            try store.putInode(51, sampleInode())
            #expect(store.isCommitDue(age: .seconds(3600), volume: 1 << 30) == false, "not due yet")
            #expect(store.isCommitDue(age: .zero, volume: 1 << 30))
            #expect(store.isCommitDue(age: .seconds(3600), volume: 1), "due by volume")
            try store.commit()
            #expect(store.generation == g0 + 2)
            #expect(store.isCommitDue(age: .zero, volume: 0) == false, "nothing pending")
            store.close()
            let reopened = try made.open()
            defer { reopened.close() }
            #expect(reopened.generation == g0 + 2)
            #expect(try reopened.inode(50) != nil && reopened.inode(51) != nil)
        }
    }

    /// A group commit is atomic and visible to a reopened store, but the rollback ledger hears only of
    /// durable commits: after a power cut, unsynced commits may be gone, and a ledger that had counted
    /// them would call the synced store a rollback.
    @Test(arguments: StoreEngine.allCases) func onlyDurableCommitsReachTheLedger(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, made) = try makeStore(engine, in: dir)
            let heard = Mutex<[UInt64]>([])
            store.onCommit = { g in heard.withLock { $0.append(g) } }
            let g0 = store.generation
            try store.putInode(60, sampleInode())
            try store.commit(durable: false)
            #expect(store.generation == g0 + 1)
            #expect(heard.withLock { $0 }.isEmpty, "a group commit is not durable yet")
            try store.commit()
            #expect(heard.withLock { $0 } == [g0 + 1], "a durable commit with nothing new still syncs and reports the last generation")
            try store.putInode(61, sampleInode())
            try store.commit(durable: false)
            store.close()
            let reopened = try made.open()
            defer { reopened.close() }
            #expect(reopened.generation == g0 + 2)
            #expect(try reopened.inode(60) != nil && reopened.inode(61) != nil)
        }
    }

    @Test(arguments: StoreEngine.allCases) func committedDataIsVisibleToASecondReaderUncommittedIsNot(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, made) = try makeStore(engine, in: dir)
            defer { store.close() }
            let reader = try made.open(readOnly: true)
            defer { reader.close() }
            #expect(reader.readOnly)
            try store.putInode(60, sampleInode(size: 1))
            try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("pending"), ino: 60, type: 0o100000))
            #expect(try store.inode(60) != nil, "the writer sees its own open transaction")
            #expect(try reader.inode(60) == nil, "uncommitted data must not be visible")
            #expect(try reader.entry(parent: 1, name: b("pending")) == nil)
            try store.commit()
            #expect(try reader.inode(60)?.size == 1)
            #expect(try reader.entry(parent: 1, name: b("pending"))?.ino == 60)
            // The reader refuses writes.
            expectError(StoreError.readOnly) { try reader.putInode(61, sampleInode()) }
        }
    }

    @Test func crashWithAnOpenTransactionKeepsOnlyTheLastCommit() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            defer { store.close() }
            try store.putInode(70, sampleInode(size: 70))
            try store.commit()
            let committedGeneration = store.generation
            try store.putInode(70, sampleInode(size: 71))
            try store.putInode(71, sampleInode(size: 1))
            // Enough uncommitted data that some of it spills to the WAL before the commit.
            let file = (try EntityStore.newContentId())
            try store.putTestChunks(file: file, count: 64, seed: 7, keys: keys)
            // "Crash": copy the files as they are on disk while the transaction is open.
            let crash = dir + "/crash"
            try FileManager.default.createDirectory(atPath: crash, withIntermediateDirectories: false)
            for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
                try FileManager.default.copyItem(atPath: path + suffix, toPath: crash + "/store.db" + suffix)
            }
            let recovered = try EntityStore.open(at: crash + "/store.db", keys: keys)
            defer { recovered.close() }
            #expect(recovered.generation == committedGeneration)
            #expect(try recovered.inode(70)?.size == 70)
            #expect(try recovered.inode(71) == nil)
            #expect(try recovered.chunkIndices(file: file).isEmpty)
        }
    }

    /// After a crash SQLite forgets that the frames in the WAL were already checkpointed; the store
    /// folds them in when it opens, so the first commit rewrites the WAL from its start instead of
    /// growing the file (which a full disk refuses: KilledOnAFullDiskTests).
    @Test func firstCommitAfterACrashRewritesTheWALInPlace() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segmentThreshold = .max  // content in rows: this is about the WAL
            defer { store.close() }
            // One large commit: its frames fill the WAL file to its end. Then they are checkpointed.
            let file = try EntityStore.newContentId()
            try store.putTestChunks(file: file, count: 32, seed: 9, keys: keys)
            try store.putInode(80, sampleInode(size: 32 * 65536, contentId: file))
            try store.commit()
            let folded = try store.sqlite.pool.writeWithoutTransaction { try $0.checkpoint(.passive) }
            #expect(folded.walFrameCount > 100 && folded.checkpointedFrameCount == folded.walFrameCount, "\(folded)")

            // "Crash": copy the files as they are on disk, WAL and shared memory included.
            let crash = dir + "/crash"
            try FileManager.default.createDirectory(atPath: crash, withIntermediateDirectories: false)
            for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
                try FileManager.default.copyItem(atPath: path + suffix, toPath: crash + "/store.db" + suffix)
            }
            let walBefore = try #require(try FileManager.default.attributesOfItem(atPath: crash + "/store.db-wal")[.size] as? Int)
            #expect(walBefore > 32 * 65536)
            let recovered = try EntityStore.open(at: crash + "/store.db", keys: keys)
            try recovered.putInode(81, sampleInode(size: 1))
            try recovered.deleteChunks(file: file, from: 16)
            try recovered.commit()
            let walAfter = try #require(try FileManager.default.attributesOfItem(atPath: crash + "/store.db-wal")[.size] as? Int)
            #expect(walAfter == walBefore, "the first commit after the crash grew the WAL from \(walBefore) to \(walAfter) bytes")
            #expect(try recovered.inode(80)?.size == 32 * 65536)
            #expect(try recovered.inode(81)?.size == 1)
            #expect(try recovered.chunkIndices(file: file) == (0..<16).map { UInt64($0) })
            recovered.close()
            // Both commits are in the store when it is opened again.
            let reopened = try EntityStore.open(at: crash + "/store.db", keys: keys)
            defer { reopened.close() }
            #expect(try reopened.inode(81)?.size == 1)
            #expect(try reopened.chunkIndices(file: file) == (0..<16).map { UInt64($0) })
            let first = try #require(try reopened.sealedChunks(file: file, first: 0, last: 0).first)
            var plain = [UInt8](repeating: 0, count: 65536)
            let n = try plain.withUnsafeMutableBytes { try reopened.contentCipher(contentId: file).open(first.sealed, index: 0, into: $0) }
            #expect(n == 65536 && plain == [UInt8](repeating: 9, count: 65536), "chunk 0 holds seed 9")
        }
    }

    /// Committed content is read through two reader pools: a file's first chunks through connections
    /// that map the store and map it afresh every few MiB (ChunkReaders.remapAfter), the rest through
    /// preads. Read over and over across remaps, every chunk is what was written.
    @Test func contentReadsAcrossBothReaderPoolsAndRemaps() throws {
        try withTempDir { dir in
            let (store, keys, _) = try makeStore(in: dir)
            defer { store.close() }
            store.sqlite.segmentThreshold = .max  // content in rows: this is about the mapping
            let file = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: file)
            let count = 2 * Int(SQLiteBackend.mappedChunks)
            try store.putTestChunks(file: file, count: count, seed: 0, keys: keys)
            try store.commit()
            var out = [UInt8](repeating: 0, count: 65536)
            // Enough passes that the mapped pool remaps at least three times.
            let passes = 3 * ChunkReaders.remapAfter / (Int(SQLiteBackend.mappedChunks) * 65536) + 1
            for pass in 0..<passes {
                var seen = 0
                for first in stride(from: 0, to: count, by: 8) {
                    try store.forEachChunk(file: file, first: UInt64(first), last: UInt64(first + 7)) { index, sealed in
                        let n = try out.withUnsafeMutableBytes { try cipher.open(sealed, index: index, into: $0) }
                        #expect(n == 65536 && out.allSatisfy { $0 == UInt8(index & 0xFF) }, "pass \(pass): chunk \(index) differs")
                        seen += 1
                    }
                }
                #expect(seen == count)
            }
            #expect(store.sqlite.mappedReaders.remaps.load(ordering: .relaxed) >= 3)
            #expect(store.sqlite.preadReaders.remaps.load(ordering: .relaxed) == 0)
        }
    }

    /// Someone truncates the store while readers map it (a sync client replacing the file, an attacker):
    /// reading the pages that are gone fails with an error instead of killing the process with SIGBUS
    /// (CMappedFault maps zeros over them, which SQLite reports as a damaged page).
    @Test func truncatedStoreUnderAMappingFailsInsteadOfCrashing() throws {
        try withTempDir { dir in
            // Not named store.db: the guard does not go by the file's name (other stores of this process
            // have other names, and whichever opened first must not decide).
            let (store, keys, path) = try makeStore(in: dir, name: "guarded.db")
            defer { store.close() }
            let file = try EntityStore.newContentId()
            let count = Int(SQLiteBackend.mappedChunks)  // all through the mapped pool
            try store.putTestChunks(file: file, count: count, seed: 0, keys: keys)
            try store.commit()
            try store.sqlite.pool.writeWithoutTransaction { _ = try $0.checkpoint(.truncate) }  // pages in the file, not the WAL
            var seen = 0
            try store.forEachChunk(file: file, first: 0, last: UInt64(count - 1)) { _, _ in seen += 1 }
            #expect(seen == count, "read before the truncation")
            let before = ChunkReaders.faultsRepaired
            #expect(truncate(path, 64 * 1024) == 0)
            var failed = false
            do {
                try store.forEachChunk(file: file, first: 0, last: UInt64(count - 1)) { _, _ in }
            } catch { failed = true }
            #expect(failed, "chunks past the end of the truncated file were read")
            #expect(ChunkReaders.faultsRepaired > before, "the read did not go through the mapping")
        }
    }

    /// The writer's page cache is large only while a group transaction is open (room for the whole
    /// group); between transactions it is small, so metadata reads do not keep the group-size cache resident.
    @Test func writerCacheIsLargeOnlyInsideAGroup() throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(in: dir)
            defer { store.close() }
            func cacheKiB() throws -> Int { -(try store.sqlite.writer { db in try Int.fetchOne(db, sql: "PRAGMA cache_size") } ?? 0) }
            #expect(try cacheKiB() == SQLiteBackend.idleWriterCacheKiB)
            try store.putInode(90, sampleInode(size: 1))
            #expect(try cacheKiB() == SQLiteBackend.writerCacheKiB)
            try store.commit()
            #expect(try cacheKiB() == SQLiteBackend.idleWriterCacheKiB)
            #expect(try store.inode(90)?.size == 1)
            #expect(try cacheKiB() == SQLiteBackend.idleWriterCacheKiB, "a read opens no group")
        }
    }

    @Test func openRefusesWhatIsNotAStore() throws {
        try withTempDir { dir in
            let keys = try ContainerKeys(master: try SecureBytes.random(count: 32), containerId: try Random.bytes(16))
            if case .notAStore? = storeError({ _ = try EntityStore.open(at: dir + "/missing.db", keys: keys) }) {
            } else {
                Issue.record("a missing store must be notAStore")
            }
            #expect(FileManager.default.createFile(atPath: dir + "/junk.db", contents: Data(repeating: 0x41, count: 8192)))
            if case .notAStore? = storeError({ _ = try EntityStore.open(at: dir + "/junk.db", keys: keys) }) {
            } else {
                Issue.record("a junk file must be notAStore")
            }
            // An SQLite database that is not ours.
            let q = try DatabaseQueue(path: dir + "/other.db")
            try q.write { db in try db.execute(sql: "CREATE TABLE t(x)") }
            try q.close()
            if case .notAStore? = storeError({ _ = try EntityStore.open(at: dir + "/other.db", keys: keys) }) {
            } else {
                Issue.record("a foreign SQLite database must be notAStore")
            }
        }
    }
}
