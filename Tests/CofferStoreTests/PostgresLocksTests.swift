import CofferStoreTestSupport
import Foundation
import Testing

@testable import CofferStore

/// The lock table's own logic: one owner's ranges as fcntl(F_SETLK) leaves them, and conflicts decided
/// across holders (mounts) in the `locks` table, rows of lapsed leases ignored and removed.
@Suite("File locks shared by mounts")
struct PostgresLocksTests {
    private func r(_ t: FileLockType, _ a: Int64, _ b: Int64) -> FileLockRange { FileLockRange(t, a, b) }
    private let end = FileLockRange.toEnd

    @Test func rangesSplitReplaceAndMerge() {
        // A new range on nothing.
        #expect(FileLockRange.applying([], type: .write, start: 0, end: 99) == [r(.write, 0, 99)])
        // Unlocking a sub-range splits; the two ends stay.
        #expect(FileLockRange.applying([r(.write, 0, 99)], type: nil, start: 40, end: 59) == [r(.write, 0, 39), r(.write, 60, 99)])
        // Unlocking the start or the end cuts.
        #expect(FileLockRange.applying([r(.write, 0, 99)], type: nil, start: 0, end: 49) == [r(.write, 50, 99)])
        #expect(FileLockRange.applying([r(.write, 0, 99)], type: nil, start: 50, end: end) == [r(.write, 0, 49)])
        // A read lock inside a write lock: three pieces.
        #expect(
            FileLockRange.applying([r(.write, 0, 99)], type: .read, start: 10, end: 19) == [r(.write, 0, 9), r(.read, 10, 19), r(.write, 20, 99)])
        // Touching and overlapping ranges of one type merge; of different types they do not.
        #expect(FileLockRange.applying([r(.read, 0, 9)], type: .read, start: 10, end: 19) == [r(.read, 0, 19)])
        #expect(FileLockRange.applying([r(.read, 0, 9), r(.read, 20, 29)], type: .read, start: 5, end: 24) == [r(.read, 0, 29)])
        #expect(FileLockRange.applying([r(.read, 0, 9)], type: .write, start: 10, end: 19) == [r(.read, 0, 9), r(.write, 10, 19)])
        // To the end of any file, and unlocking everything.
        #expect(FileLockRange.applying([r(.write, 100, 199)], type: .write, start: 150, end: end) == [r(.write, 100, end)])
        #expect(FileLockRange.applying([r(.write, 0, 9), r(.read, 20, end)], type: nil, start: 0, end: end) == [])
        // Replacing a range with the other type, exactly.
        #expect(FileLockRange.applying([r(.write, 0, 9)], type: .read, start: 0, end: 9) == [r(.read, 0, 9)])
        // Unlocking what is not held changes nothing.
        #expect(FileLockRange.applying([r(.write, 0, 9)], type: nil, start: 20, end: 29) == [r(.write, 0, 9)])
    }

    /// Two holders (mounts) with live leases: conflicts by range and type, an owner never conflicts with
    /// itself, flock and POSIX locks are separate; a holder whose lease row goes loses its locks.
    @Test func holdersConflictAndLapse() throws {
        let location = try TestPostgres.freshLocation()
        let cluster = try TestPostgres.cluster()
        let q = PostgresIdentifier.quoted(location.container)
        try cluster.psql("CREATE SCHEMA \(q)")
        try cluster.psql(PostgresSQL(schema: location.container).createLeases)
        for h in ["one", "two"] {
            try cluster.psql(
                "INSERT INTO \(q).leases VALUES ('\(h)', '\(PostgresLease.hostName())', 1, 'm-\(h)', 'mount', now() + interval '1 hour')")
        }
        let one = try PostgresLocks(location, holder: "one")
        let two = try PostgresLocks(location, holder: "two")
        defer {
            one.close()
            two.close()
        }
        let got = try one.set(inode: 5, kind: .posix, owner: 1, type: .write, start: 0, end: 99, pid: 100)
        #expect(got.conflict == nil && got.held)
        // Another holder: overlapping refused (naming the range and pid), beside it granted.
        let refused = try two.set(inode: 5, kind: .posix, owner: 1, type: .read, start: 50, end: 149, pid: 200)
        #expect(refused.conflict == FileLockConflict(range: FileLockRange(.write, 0, 99), pid: 100) && !refused.held)
        #expect(try two.set(inode: 5, kind: .posix, owner: 1, type: .write, start: 100, end: 149, pid: 200).conflict == nil)
        // Another owner of the same holder conflicts too; the same owner replaces its own range.
        #expect(try one.set(inode: 5, kind: .posix, owner: 2, type: .read, start: 10, end: 10, pid: 101).conflict != nil)
        #expect(try one.set(inode: 5, kind: .posix, owner: 1, type: .read, start: 0, end: 99, pid: 100).conflict == nil)
        // Read locks share.
        #expect(try two.set(inode: 5, kind: .posix, owner: 1, type: .read, start: 0, end: 9, pid: 200).conflict == nil)
        #expect(try two.test(inode: 5, kind: .posix, owner: 7, type: .write, start: 0, end: 0) != nil)
        // Another inode, and flock locks, are apart.
        #expect(try two.set(inode: 6, kind: .posix, owner: 1, type: .write, start: 0, end: FileLockRange.toEnd, pid: 200).conflict == nil)
        #expect(try two.set(inode: 5, kind: .flock, owner: 9, type: .write, start: 0, end: FileLockRange.toEnd, pid: 200).conflict == nil)
        // An unlock keeps the pid of the holder (the kernel sends none with it).
        _ = try one.set(inode: 5, kind: .posix, owner: 1, type: nil, start: 0, end: 49, pid: 0)
        let seen = try two.test(inode: 5, kind: .posix, owner: 3, type: .write, start: 50, end: 99)
        #expect(seen == FileLockConflict(range: FileLockRange(.read, 50, 99), pid: 100))
        // Holder one's lease lapses: its locks no longer count, and its rows go.
        try cluster.psql("UPDATE \(q).leases SET expires = now() - interval '1 second' WHERE holder = 'one'")
        #expect(try two.set(inode: 5, kind: .posix, owner: 1, type: .write, start: 50, end: 99, pid: 200).conflict == nil)
        #expect(try cluster.psql("SELECT count(*) FROM \(q).locks WHERE holder = 'one'").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        // A row the server made up with a reversed or negative range is read as a valid range.
        try cluster.psql("INSERT INTO \(q).locks VALUES (8, 0, 'two', 99, 1, -5, -9, 1)")
        #expect(try one.test(inode: 8, kind: .posix, owner: 1, type: .read, start: 0, end: 0)?.range == FileLockRange(.write, 0, 0))
        // Unmount: every row of the holder goes.
        two.releaseAll()
        #expect(try cluster.psql("SELECT count(*) FROM \(q).locks").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
    }
}
