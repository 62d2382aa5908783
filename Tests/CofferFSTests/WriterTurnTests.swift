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
    @Test func aBusyGroupEndsForAReaderAfterItsSliceAndForAWriterOnceItPauses() throws {
        let dir = try makeTempDir()
        let made = try TestStore.create(.postgres, in: dir, name: SQLiteBackend.fileName)
        let location = try #require(made.location)
        let leaseA = try PostgresLease.take(location, purpose: "mount", machine: "turn-a")
        let leaseB = try PostgresLease.take(location, purpose: "mount", machine: "turn-b")
        defer {
            leaseA.release()
            leaseB.release()
        }
        func shared(_ holder: String) throws -> EntityStore {
            let store = try made.open()
            let backend = try #require(store.backend as? PostgresBackend)
            backend.coherent = true
            backend.fenceHolder = holder
            store.shareWithOtherMounts(floor: 0)
            return store
        }
        // No interval ends a group here, the slice is over at once, and a pause is 0.2 s without a change.
        var options = CofferFileSystem.Options()
        options.coherent = true
        options.commitInterval = .seconds(3600)
        options.sharedCommitInterval = .seconds(3600)
        options.writerSlice = .zero
        options.writerPause = .milliseconds(200)
        let fs = try CofferFileSystem(
            store: try shared(leaseA.me.holder), chunkSize: 4096, options: options, statfsPath: dir, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let a = SharedMount(fs)
        let b = try shared(leaseB.me.holder)
        defer { b.close() }

        for reader in [false, true] {
            let what = reader ? "a reader" : "a writer"
            _ = try a.mkdir(parent: root, name: Array("\(what) 1".utf8), mode: 0o755, caller: caller)
            #expect(fs.store.hasPendingChanges, "\(what): a's group is open")
            let waiter = BackgroundCall { if reader { try b.catchUp() } else { try b.beginGroup() } }
            #expect(waitUntil(10, every: 0.01) { fs.store.othersWaiting }, "\(what): a heard the request")
            #expect(fs.store.readersWaiting == reader)
            // Busy: the next change ends, and the group with it only for a reader.
            _ = try a.mkdir(parent: root, name: Array("\(what) 2".utf8), mode: 0o755, caller: caller)
            if reader {
                #expect(!fs.store.hasPendingChanges, "a reader's wait ends a busy group after its slice")
            } else {
                #expect(fs.store.hasPendingChanges, "a writer's wait does not end a busy group")
                #expect(!waiter.done, "the writer still waits")
                usleep(300_000)  // a pause between changes
                try fs.commitIfDueOutsideChanges()
                #expect(!fs.store.hasPendingChanges, "once a has paused, its group ends for the writer")
            }
            #expect(waitUntil(10, every: 0.01) { waiter.done }, "\(what) goes on")
            #expect(waiter.failure == nil)
            #expect(try b.entry(parent: root, name: Array("\(what) 2".utf8)) != nil, "\(what) sees a's changes")
            if !reader { try b.commit(durable: false) }
        }
    }
}
