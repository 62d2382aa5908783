import Foundation
import Glibc
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore

// Issue 15: under the writeback cache the kernel owns a regular file's mtime and ctime and sends them in
// SETATTRs, sometimes before the WRITEs of the same data. The filesystem keeps exactly the times it is sent.
@Suite("Times under the writeback cache")
struct KernelTimesTests {
    static let past = Timestamp(seconds: 1_600_000_000, nanoseconds: 123_456_789)

    /// A file whose mtime and ctime are `past`, as a kernel SETATTR (fuse_flush_times) sets them.
    func fileWithPastTimes(_ f: Fixture) throws -> InodeNumber {
        let ino = try f.file("f", b("hello"))
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mtime: .set(Self.past), ctime: Self.past), handle: nil, caller: caller)
        return ino
    }

    @Test func dataChangesKeepTheKernelsTimes() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        f.fs.writebackCacheGranted(true)
        let ino = try fileWithPastTimes(f)
        try f.write(ino, .none, at: 3, b("big write"))
        try f.write(ino, .none, at: 200_000, [7])
        try f.fs.fallocate(ino, handle: .none, mode: 0, offset: 0, length: 500_000)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: 500_000), handle: nil, caller: caller)  // truncate(2), same size
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: 10), handle: nil, caller: caller)
        f.fs.release(ino, handle: .none)
        try f.remount()
        let a = try f.fs.getattr(ino)
        #expect(a.size == 10)
        #expect(a.mtime == Self.past && a.ctime == Self.past, "mtime \(a.mtime), ctime \(a.ctime)")
        // The times the kernel sends are kept as sent.
        let later = Timestamp(seconds: 1_700_000_000, nanoseconds: 1)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mtime: .set(later), ctime: later), handle: nil, caller: caller)
        #expect(try f.fs.getattr(ino).mtime == later && f.fs.getattr(ino).ctime == later)
    }

    @Test func withoutTheCacheWritesStampTimesAndDirectoriesAlways() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try fileWithPastTimes(f)
        try f.write(ino, .none, at: 0, b("x"))
        let a = try f.fs.getattr(ino)
        #expect(a.mtime != Self.past && a.ctime != Self.past, "a write without the writeback cache stamps its times")

        f.fs.writebackCacheGranted(true)
        let d = try f.mkdir("d")
        _ = try f.fs.setattr(d, changes: AttributeChanges(mtime: .set(Self.past)), handle: nil, caller: caller)
        try f.mkdir("e", in: d)
        #expect(try f.fs.getattr(d).mtime != Self.past, "a directory's times are the filesystem's own")
    }
}
