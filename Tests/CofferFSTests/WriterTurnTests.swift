import CofferStoreTestSupport
import CofferTestSupport
import Foundation
import Logging
import Testing

@testable import CofferFS
@testable import CofferStore

/// Two mounts of one PostgreSQL container take turns with the writer lock. A busy mount ends its group
/// for another mount's open or lookup once the group had its slice (close-to-open stays short), but
/// for another writer only once it pauses between changes: each turn costs both mounts, so a busy
/// pair takes long turns (CofferFileSystem.yieldsToOthers; bench/multi.sh counts them).
@Suite("Turns of the writer lock")
struct WriterTurnTests {
    /// A container, A's lease and filesystem, whose groups no interval ends unless `sharedInterval`
    /// says so (a slice is over at once, and a pause is 2 s without a change: a loaded machine's delays
    /// stay below it), and B's lease and store (a mount's, minus the filesystem), taken by `mountB`.
    private final class Pair {
        let fs: CofferFileSystem, a: SharedMount
        private let made: TestStore, location: PostgresLocation
        private var leases: [PostgresLease] = []
        private var stores: [EntityStore] = []
        init(sharedInterval: Duration = .seconds(3600)) throws {
            let dir = try makeTempDir()
            made = try TestStore.create(.postgres, in: dir, name: SQLiteBackend.fileName)
            location = try #require(made.location)
            self.sharedInterval = sharedInterval
            let store = try Self.shared(made, location, machine: "turn-a", &leases)
            fs = try CofferFileSystem(
                store: store, chunkSize: 4096, options: Self.options(sharedInterval), statfsPath: dir, logger: Logger(label: "test"))
            a = SharedMount(fs)
        }
        private let sharedInterval: Duration
        private static func options(_ sharedInterval: Duration) -> CofferFileSystem.Options {
            var options = CofferFileSystem.Options()
            options.coherent = true
            options.commitInterval = .seconds(3600)
            options.sharedCommitInterval = sharedInterval
            options.writerSlice = .zero
            options.writerPause = .seconds(2)
            options.removesOrphans = false
            return options
        }
        /// A mount's store: its lease first, coherent, sharing with others.
        private static func shared(_ made: TestStore, _ location: PostgresLocation, machine: String, _ leases: inout [PostgresLease]) throws
            -> EntityStore
        {
            let lease = try PostgresLease.take(location, purpose: "mount", machine: machine)
            leases.append(lease)
            let store = try made.open()
            let backend = try #require(store.backend as? PostgresBackend)
            backend.coherent = true
            backend.fenceHolder = lease.me.holder
            store.shareWithOtherMounts(floor: 0)
            return store
        }
        func mountB() throws -> EntityStore {
            let b = try Self.shared(made, location, machine: "turn-b", &leases)
            stores.append(b)
            return b
        }
        /// B as a filesystem too, with A's options.
        func mountBFileSystem() throws -> CofferFileSystem {
            let fsB = try CofferFileSystem(
                store: try mountB(), chunkSize: 4096, options: Self.options(sharedInterval), statfsPath: nil, logger: Logger(label: "test"))
            filesystems.append(fsB)
            return fsB
        }
        private var filesystems: [CofferFileSystem] = []
        /// A's filesystem first: a waiter of B's that never got the lock must not hold B's close up.
        func close() {
            fs.shutdown()
            for f in filesystems { f.shutdown() }
            for s in stores { s.close() }
            for l in leases { l.release() }
        }
        func mkdir(_ name: String) throws { _ = try a.mkdir(parent: root, name: Array(name.utf8), mode: 0o755, caller: caller) }
    }

    @Test func aBusyGroupEndsForAReaderAfterItsSliceAndForAWriterOnceItPauses() throws {
        let p = try Pair()
        defer { p.close() }
        let (fs, b) = (p.fs, try p.mountB())
        for reader in [false, true] {
            let what = reader ? "a reader" : "a writer"
            try p.mkdir("\(what) 1")
            #expect(fs.store.hasPendingChanges, "\(what): a's group is open")
            // An open in the directory A's group changes (a group of other inodes is not waited for).
            let waiter = BackgroundCall { if reader { try b.catchUp(of: root) } else { try b.beginGroup() } }
            try #require(waitUntil(10, every: 0.01) { fs.store.othersWaiting }, "\(what): a heard the request")
            #expect(fs.store.readersWaiting == reader)
            // Busy: the next change ends, and the group with it only for a reader.
            try p.mkdir("\(what) 2")
            if reader {
                #expect(!fs.store.hasPendingChanges, "a reader's wait ends a busy group after its slice")
            } else {
                #expect(fs.store.hasPendingChanges, "a writer's wait does not end a busy group")
                try fs.commitIfDueOutsideChanges()
                #expect(fs.store.hasPendingChanges, "nor does the committer's look before a pause")
                #expect(!waiter.done, "the writer still waits")
                usleep(2_100_000)  // a pause between changes
                try fs.commitIfDueOutsideChanges()
                #expect(!fs.store.hasPendingChanges, "once a has paused, its group ends for the writer")
            }
            try #require(waitUntil(10, every: 0.01) { waiter.done }, "\(what) goes on")
            #expect(waiter.failure == nil)
            #expect(try b.entry(parent: root, name: Array("\(what) 2".utf8)) != nil, "\(what) sees a's changes")
            if !reader { try b.commit(durable: false) }
        }
    }

    /// A group begun while A was the only mount runs to A's own commit interval (a second by default)
    /// unless another mount waits: then to the interval of mounts beside others, busy or not (a mount
    /// that joins takes the writer lock once before it mounts; it waited up to a second).
    @Test func aGroupBegunAloneEndsAtTheSharedIntervalOnceAWriterWaits() throws {
        let p = try Pair(sharedInterval: .zero)
        defer { p.close() }
        let fs = p.fs
        try p.mkdir("alone 1")
        #expect(fs.store.isAlone, "A's group began alone")
        let b = try p.mountB()
        try p.mkdir("alone 2")
        #expect(fs.store.hasPendingChanges, "alone, the group runs to A's own interval")
        let waiter = BackgroundCall { try b.beginGroup() }
        try #require(waitUntil(10, every: 0.01) { fs.store.othersWaiting }, "a heard the request")
        try p.mkdir("alone 3")
        #expect(!fs.store.hasPendingChanges, "a writer's wait ends the busy group at the shared interval")
        try #require(waitUntil(10, every: 0.01) { waiter.done }, "the writer goes on")
        #expect(waiter.failure == nil)
        try b.commit(durable: false)
    }

    /// Names made in different directories: each mount's group holds its directory, not the container,
    /// and neither waits for the other; a name made in the other's directory waits for its group.
    @Test func mountsMakingNamesInDifferentDirectoriesGoOnAtOnce() throws {
        let p = try Pair()
        defer { p.close() }
        let fs = p.fs, b = SharedMount(try p.mountBFileSystem())
        // Both write (beside a mount that writes nothing, a group takes the container: InodeGroupTests).
        _ = try b.mkdir(parent: root, name: Array("z".utf8), mode: 0o755, caller: caller)
        try b.fs.commitGroup(durable: false)
        try p.mkdir("x")
        try p.mkdir("y")
        try fs.commitGroup(durable: false)
        func busy(_ f: CofferFileSystem) -> Bool { (f.store.backend as? PostgresBackend)?.othersBusy == true }
        #expect(waitUntil(10, every: 0.01) { busy(fs) && busy(b.fs) }, "each heard the other's commit")
        let x = try p.a.lookup(parent: root, name: Array("x".utf8)).ino, y = try p.a.lookup(parent: root, name: Array("y".utf8)).ino
        _ = try p.a.mkdir(parent: x, name: Array("a".utf8), mode: 0o755, caller: caller)
        #expect(fs.store.holdsInodeGroup, "A's group holds x, not the container")
        let beside = BackgroundCall {
            let (made, _) = try b.create(parent: y, name: Array("b".utf8), mode: 0o644, flags: O_RDWR, caller: caller)
            let data: [UInt8] = Array("from b".utf8)
            _ = try data.withUnsafeBytes { try b.write(made.ino, handle: .none, offset: 0, data: $0) }
            try b.fs.commitGroup(durable: false)
        }
        #expect(waitUntil(10, every: 0.01) { beside.done }, "B makes and writes a file in y while A's group is open")
        #expect(beside.failure == nil)
        #expect(fs.store.hasPendingChanges && !fs.store.othersWaiting, "A's group went on, and nobody asked for it")
        let inX = BackgroundCall { _ = try b.mkdir(parent: x, name: Array("c".utf8), mode: 0o755, caller: caller) }
        #expect(waitUntil(10, every: 0.01) { fs.store.othersWaiting }, "B asks for x")
        usleep(200_000)
        #expect(!inX.done, "B's name in x waits for A's group")
        try fs.commitGroup(durable: false)
        #expect(waitUntil(10, every: 0.01) { inX.done })
        #expect(inX.failure == nil)
        try b.fs.commitGroup(durable: false)
        for (name, parent) in [("a", x), ("c", x), ("b", y)] {
            #expect((try? p.a.lookup(parent: parent, name: Array(name.utf8))) != nil, "A sees \(name)")
            #expect((try? b.lookup(parent: parent, name: Array(name.utf8))) != nil, "B sees \(name)")
        }
    }
}
