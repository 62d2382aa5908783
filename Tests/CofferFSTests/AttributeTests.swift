import Foundation
import GRDB
import Glibc
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore

@Suite("Attributes, symlinks, xattrs")
struct AttributeTests {
    @Test func chmodKeepsTheTypeBits() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("f")
        let d = try f.mkdir("d")
        #expect(try f.fs.setattr(ino, changes: AttributeChanges(mode: 0o4750), handle: nil, caller: caller).mode == UInt32(S_IFREG) | 0o4750)
        // Type bits in the request are ignored.
        #expect(
            try f.fs.setattr(ino, changes: AttributeChanges(mode: UInt32(S_IFDIR) | 0o600), handle: nil, caller: caller).mode == UInt32(S_IFREG)
                | 0o600)
        #expect(try f.fs.setattr(d, changes: AttributeChanges(mode: 0o1777), handle: nil, caller: caller).mode == UInt32(S_IFDIR) | 0o1777)
        try f.remount()
        #expect(try f.fs.getattr(ino).mode == UInt32(S_IFREG) | 0o600)
        #expect(try f.fs.getattr(d).mode == UInt32(S_IFDIR) | 0o1777)
    }

    @Test func chown() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("f")
        let before = try f.fs.getattr(ino)
        #expect(before.uid == 0 && before.gid == 0)
        var a = try f.fs.setattr(ino, changes: AttributeChanges(uid: 1000, gid: 2000), handle: nil, caller: caller)
        #expect(a.uid == 1000 && a.gid == 2000)
        a = try f.fs.setattr(ino, changes: AttributeChanges(uid: UInt32.max, gid: 3000), handle: nil, caller: caller)  // -1: unchanged
        #expect(a.uid == 1000 && a.gid == 3000)
        // chown clears setuid, and setgid when group-executable.
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mode: 0o6755), handle: nil, caller: caller)
        a = try f.fs.setattr(ino, changes: AttributeChanges(uid: 5), handle: nil, caller: caller)
        #expect(a.mode & 0o7777 == 0o0755)
        try f.remount()
        #expect(try f.fs.getattr(ino).uid == 5)
        #expect(try f.fs.getattr(ino).gid == 3000)
    }

    @Test func utimensWithNanosecondsAndNow() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("f")
        let atime = Timestamp(seconds: 1_000_000_000, nanoseconds: 123_456_789)
        let mtime = Timestamp(seconds: -5, nanoseconds: 999_999_999)  // before the epoch
        let beforeCtime = try f.fs.getattr(ino).ctime
        let a = try f.fs.setattr(ino, changes: AttributeChanges(atime: .set(atime), mtime: .set(mtime)), handle: nil, caller: caller)
        #expect(a.atime == atime)
        #expect(a.mtime == mtime)
        #expect(a.ctime.seconds >= beforeCtime.seconds)
        try f.remount()
        let back = try f.fs.getattr(ino)
        #expect(back.atime == atime && back.mtime == mtime, "nanoseconds survive the store")
        let start = Timestamp.now()
        let now = try f.fs.setattr(ino, changes: AttributeChanges(atime: .now, mtime: .now), handle: nil, caller: caller)
        let end = Timestamp.now()
        for t in [now.atime, now.mtime] {
            #expect((t.seconds, t.nanoseconds) >= (start.seconds, start.nanoseconds))
            #expect((t.seconds, t.nanoseconds) <= (end.seconds, end.nanoseconds))
        }
        // Writing moves mtime and ctime.
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mtime: .set(mtime)), handle: nil, caller: caller)
        let h = try f.fs.open(ino, flags: O_WRONLY, caller: caller).handle
        try f.write(ino, h, at: 0, b("x"))
        f.fs.release(ino, handle: h)
        #expect(try f.fs.getattr(ino).mtime.seconds >= start.seconds)
    }

    /// The kernel decides when set-id bits go (KILLPRIV_V2 marks): a write alone keeps them (root's write, as on
    /// ext4); clearSetID drops set-user-ID, and set-group-ID only when group-executable.
    @Test func setIDBitsAreClearedWhenAsked() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("f")
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mode: 0o6755), handle: nil, caller: caller)
        let h = try f.fs.open(ino, flags: O_WRONLY, caller: caller).handle
        try f.write(ino, h, at: 0, b("x"))
        #expect(try f.fs.getattr(ino).mode & 0o7777 == 0o6755, "a write alone keeps the bits")
        try f.fs.clearSetID(ino)
        try f.write(ino, h, at: 1, b("y"))
        f.fs.release(ino, handle: h)
        #expect(try f.fs.getattr(ino).mode & 0o7777 == 0o0755)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(mode: 0o6745), handle: nil, caller: caller)
        let a = try f.fs.setattr(ino, changes: AttributeChanges(size: 1, clearSetID: true), handle: nil, caller: caller)
        #expect(a.mode & 0o7777 == 0o2745, "set-group-ID without group-execute stays")
        try f.remount()
        #expect(try f.fs.getattr(ino).mode & 0o7777 == 0o2745)
    }

    @Test func setgidDirectoryRule() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let shared = try f.mkdir("shared", mode: 0o775)
        _ = try f.fs.setattr(shared, changes: AttributeChanges(gid: 4242), handle: nil, caller: caller)
        _ = try f.fs.setattr(shared, changes: AttributeChanges(mode: 0o2775), handle: nil, caller: caller)
        let user = Caller(uid: 1000, gid: 1000)
        let (file, open) = try f.fs.create(parent: shared, name: b("doc"), mode: 0o644, flags: O_RDWR, caller: user)
        f.fs.release(file.ino, handle: open.handle)
        #expect(file.gid == 4242, "a new file takes the setgid directory's group")
        #expect(file.uid == 1000)
        #expect(file.mode & UInt32(S_ISGID) == 0)
        let sub = try f.fs.mkdir(parent: shared, name: b("sub"), mode: 0o755, caller: user)
        #expect(sub.gid == 4242)
        #expect(sub.mode & UInt32(S_ISGID) != 0, "subdirectories inherit the setgid bit")
        let nested = try f.fs.mkdir(parent: sub.ino, name: b("nested"), mode: 0o755, caller: user)
        #expect(nested.gid == 4242 && nested.mode & UInt32(S_ISGID) != 0)
        // Outside: the caller's group.
        let plain = try f.fs.mkdir(parent: root, name: b("plain"), mode: 0o755, caller: user)
        #expect(plain.gid == 1000 && plain.mode & UInt32(S_ISGID) == 0)
    }

    @Test func symlinksWithoutARoot() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        for (name, target) in [("abs", "/etc/hosts"), ("rel", "../x/y"), ("dots", "/a/./b/../c"), ("long", String(repeating: "z", count: 4095))] {
            let a = try f.fs.symlink(parent: root, name: b(name), target: b(target), caller: caller)
            #expect(a.mode == UInt32(S_IFLNK) | 0o777)
            #expect(a.size == UInt64(target.utf8.count))
            #expect(try f.fs.readlink(a.ino) == b(target))
        }
        expectError(FSError.nameTooLong) {
            _ = try f.fs.symlink(parent: root, name: b("toolong"), target: [UInt8](repeating: 0x61, count: 4097), caller: caller)
        }
        expectSomeError(FSError.self) { _ = try f.fs.symlink(parent: root, name: b("empty"), target: [], caller: caller) }
        expectError(FSError.invalid) { _ = try f.fs.readlink(try f.file("regular")) }
        try f.remount()
        #expect(try f.fs.readlink(try f.ino("abs")) == b("/etc/hosts"))
        #expect(try f.fs.readlink(try f.ino("rel")) == b("../x/y"))
    }

    @Test func symlinkTargetsInsideTheRootFollowAMove() throws {
        var options = CofferFileSystem.Options()
        options.symlinkRoot = "/mnt/old"
        let f = try Fixture(options: options)
        defer { f.cleanup() }
        let inside = try f.fs.symlink(parent: root, name: b("inside"), target: b("/mnt/old/docs/report.txt"), caller: caller).ino
        let top = try f.fs.symlink(parent: root, name: b("top"), target: b("/mnt/old"), caller: caller).ino
        let outside = try f.fs.symlink(parent: root, name: b("outside"), target: b("/mnt/oldish/x"), caller: caller).ino
        let relative = try f.fs.symlink(parent: root, name: b("relative"), target: b("docs/report.txt"), caller: caller).ino
        let unclean = try f.fs.symlink(parent: root, name: b("unclean"), target: b("/mnt/old/a/../b"), caller: caller).ino
        #expect(try f.fs.readlink(inside) == b("/mnt/old/docs/report.txt"))
        // Stored relative to the root (new records reach the store with the group commit).
        try f.fs.commit()
        #expect(try f.store.inode(inside)?.symlinkTarget == .relative(b("docs/report.txt")))
        #expect(try f.store.inode(outside)?.symlinkTarget == .verbatim(b("/mnt/oldish/x")))
        // Mounted somewhere else.
        options.symlinkRoot = "/media/usb/vault"
        try f.remount(options: options)
        #expect(try f.fs.readlink(inside) == b("/media/usb/vault/docs/report.txt"))
        #expect(try f.fs.readlink(top) == b("/media/usb/vault"))
        #expect(try f.fs.readlink(outside) == b("/mnt/oldish/x"))
        #expect(try f.fs.readlink(relative) == b("docs/report.txt"))
        #expect(try f.fs.readlink(unclean) == b("/mnt/old/a/../b"))
        // The size is the target's length at this mountpoint (what readlink returns), as on any filesystem.
        #expect(try f.fs.getattr(inside).size == UInt64("/media/usb/vault/docs/report.txt".utf8.count))
        #expect(try f.fs.getattr(outside).size == UInt64("/mnt/oldish/x".utf8.count))
    }

    /// A target inside the mount written at PATH_MAX − 1 bytes, read under a longer mountpoint: ENAMETOOLONG,
    /// a clear error (the kernel refused the over-long reply, and readlink saw EIO); under the first
    /// mountpoint it reads back as written.
    @Test func aTargetTooLongUnderALongerMountpointIsENAMETOOLONG() throws {
        var options = CofferFileSystem.Options()
        options.symlinkRoot = "/m"
        let f = try Fixture(options: options)
        defer { f.cleanup() }
        let target = b("/m/" + String(repeating: "a", count: Int(PATH_MAX) - 4))
        let ino = try f.fs.symlink(parent: root, name: b("long"), target: target, caller: caller).ino
        try f.fs.commit()
        options.symlinkRoot = "/longer"
        try f.remount(options: options)
        expectError(FSError.nameTooLong) { _ = try f.fs.readlink(ino) }
        options.symlinkRoot = "/m"
        try f.remount(options: options)
        #expect(try f.fs.readlink(ino) == target)
    }

    @Test func hostileStoredSymlinkTargetIsEIO() throws {
        let f = try Fixture(engine: .sqlite)  // edits the SQLite file
        defer { f.cleanup() }
        let ino = try f.fs.symlink(parent: root, name: b("l"), target: b("/x"), caller: caller).ino
        f.fs.forget(ino, lookups: 1)
        // Write, with the real keys, an inode whose target escapes the root (a buggy or hostile writer).
        var w = ByteWriter()
        let good = InodeTransformer().encode(try #require(try f.store.inode(ino)))
        w.raw(good.prefix(77))
        w.u8(1)
        w.u8(1)
        w.short(b("../../etc/shadow"))
        let sealed = try f.keys.metadata.seal(w.bytes, aad: EntitySealer.associatedData(kind: .inode, id: ino.bigEndianBytes))
        try f.fs.commit()
        let q = try DatabaseQueue(path: f.storePath)
        try q.write { db in try db.execute(sql: "UPDATE inodes SET value = ? WHERE id = ?", arguments: [Data(sealed), Int64(ino)]) }
        try q.close()
        #expect(f.fs.inodes[ino] == nil)
        expectError(FSError.io) { _ = try f.fs.readlink(ino) }
        expectError(FSError.io) { _ = try f.fs.getattr(ino) }
    }

    /// A directory removed while the kernel still holds it (a setxattr by path that lost a race with rmdir, or
    /// with a rename over it) takes no attribute: its rows are gone, and one put then stayed in the store for
    /// good (a tester's fsck after such races: hundreds of unreferenced-xattr). ENOENT, as if the removal came
    /// first.
    @Test func aDirectoryRemovedWhileHeldTakesNoAttribute() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let removed = try f.fs.mkdir(parent: root, name: b("d"), mode: 0o755, caller: caller).ino
        try f.fs.rmdir(parent: root, name: b("d"))
        expectError(FSError.notFound) { try f.fs.setxattr(removed, name: b("user.x"), value: b("v"), flags: 0) }
        #expect(try f.store.xattrs(removed).isEmpty)

        let replaced = try f.fs.mkdir(parent: root, name: b("e"), mode: 0o755, caller: caller).ino
        _ = try f.fs.mkdir(parent: root, name: b("new"), mode: 0o755, caller: caller)
        try f.fs.rename(parent: root, name: b("new"), newParent: root, newName: b("e"), flags: [])
        expectError(FSError.notFound) { try f.fs.setxattr(replaced, name: b("user.x"), value: b("v"), flags: 0) }
        #expect(try f.store.xattrs(replaced).isEmpty)
    }

    @Test func extendedAttributes() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let ino = try f.file("f")
        #expect(try f.fs.listxattr(ino).isEmpty)
        expectError(FSError.noData) { _ = try f.fs.getxattr(ino, name: b("user.a")) }
        try f.fs.setxattr(ino, name: b("user.a"), value: b("1"), flags: 0)
        try f.fs.setxattr(ino, name: b("user.empty"), value: [], flags: 0)
        #expect(try f.fs.getxattr(ino, name: b("user.a")) == b("1"))
        #expect(try f.fs.getxattr(ino, name: b("user.empty")) == [])
        // XATTR_CREATE on an existing name, XATTR_REPLACE on a missing one.
        expectError(FSError.exists) { try f.fs.setxattr(ino, name: b("user.a"), value: b("2"), flags: 1) }
        expectError(FSError.noData) { try f.fs.setxattr(ino, name: b("user.b"), value: b("2"), flags: 2) }
        try f.fs.setxattr(ino, name: b("user.a"), value: b("2"), flags: 2)
        try f.fs.setxattr(ino, name: b("user.b"), value: b("3"), flags: 1)
        #expect(try f.fs.getxattr(ino, name: b("user.a")) == b("2"))
        #expect(Set(try f.fs.listxattr(ino)) == [b("user.a"), b("user.b"), b("user.empty")])
        // Other namespaces.
        expectError(FSError.notSupported) { try f.fs.setxattr(ino, name: b("trusted.x"), value: b("1"), flags: 0) }
        expectError(FSError.notSupported) { try f.fs.setxattr(ino, name: b("security.selinux"), value: b("1"), flags: 0) }
        expectError(FSError.notSupported) { _ = try f.fs.getxattr(ino, name: b("security.capability")) }
        expectError(FSError.notSupported) { _ = try f.fs.getxattr(ino, name: b("system.posix_acl_access")) }
        expectError(FSError.invalid) { try f.fs.setxattr(ino, name: b("user."), value: b("1"), flags: 0) }  // as ext4
        expectError(FSError.range) { try f.fs.setxattr(ino, name: b("user." + String(repeating: "n", count: 251)), value: [], flags: 0) }
        try f.fs.setxattr(ino, name: b("user." + String(repeating: "n", count: 250)), value: [UInt8](repeating: 7, count: 65536), flags: 0)
        expectError(FSError(E2BIG)) { try f.fs.setxattr(ino, name: b("user.big"), value: [UInt8](repeating: 7, count: 65537), flags: 0) }
        // Remove.
        try f.fs.removexattr(ino, name: b("user.a"))
        expectError(FSError.noData) { _ = try f.fs.getxattr(ino, name: b("user.a")) }
        expectError(FSError.noData) { try f.fs.removexattr(ino, name: b("user.a")) }
        expectError(FSError.notSupported) { try f.fs.removexattr(ino, name: b("trusted.a")) }
        // On directories too; not on symlinks (as Linux: user.* only on files and directories).
        try f.fs.setxattr(root, name: b("user.dir"), value: b("d"), flags: 0)
        let link = try f.fs.symlink(parent: root, name: b("l"), target: b("/x"), caller: caller).ino
        expectError(FSError.permission) { try f.fs.setxattr(link, name: b("user.l"), value: b("1"), flags: 0) }
        try f.remount()
        #expect(Set(try f.fs.listxattr(ino)) == [b("user.b"), b("user.empty"), b("user." + String(repeating: "n", count: 250))])
        #expect(try f.fs.getxattr(root, name: b("user.dir")) == b("d"))
        #expect(try f.fs.getxattr(ino, name: b("user." + String(repeating: "n", count: 250))).count == 65536)
        // Names past the kernel's 64 KiB list (XATTR_LIST_MAX) could not be listed: ENOSPC, as ext4 when full.
        let many = try f.file("many")
        let names = (0..<300).map { b("user." + String(format: "%03d", $0) + String(repeating: "x", count: 245)) }
        for name in names.prefix(258) { try f.fs.setxattr(many, name: name, value: b("v"), flags: 0) }
        expectError(FSError.noSpace) { try f.fs.setxattr(many, name: names[258], value: b("v"), flags: 0) }
        try f.fs.setxattr(many, name: names[0], value: b("replaced"), flags: 0)  // a name it has takes no more room
        try f.fs.removexattr(many, name: names[1])
        try f.fs.setxattr(many, name: names[258], value: b("v"), flags: 0)
        #expect(try f.fs.listxattr(many).count == 258)
        // Unlinking a file removes its xattrs.
        try f.fs.unlink(parent: root, name: b("f"))
        #expect(try f.store.xattrs(ino).isEmpty)
    }

    @Test func statfsReportsTheNameLimit() throws {
        let f = try Fixture()
        defer { f.cleanup() }
        let s = try f.fs.statfs()
        #expect(s.maxNameLength == 255)
        #expect(s.blockSize > 0 && s.totalBlocks > 0)
    }
}
