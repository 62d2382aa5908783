import CofferCrypto
import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore

@Suite("Container: create, unlock, key slots")
struct ContainerTests {
    @Test func createOpenUnlockWithPassword() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let passwordSlot = try required(made.container.header.slots.first(where: { $0.kind == .password }))
            #expect(made.container.header.slots.count == 2)
            #expect(made.container.header.store == SQLiteBackend.fileName, "store path must be stored container-relative")
            #expect(made.container.header.chunkSize == 65536)
            #expect(made.container.header.version == ContainerHeader.currentVersion)
            let opened = try Container.open(at: made.root)
            #expect(opened.header == made.container.header)
            let (keys, slotId) = try opened.unlock(passwordSecret(testPassword))
            #expect(slotId == passwordSlot.id)
            #expect(keys.containerId == made.keys.containerId)
            #expect(keys.containerId.count == 16)
            // The keys are the same keys: the store created with them opens with them.
            let store = try EntityStore.open(at: try opened.storePath(), keys: keys)
            defer { store.close() }
            let root = try #require(try store.inode(EntityStore.rootInode))
            #expect(root.mode & 0o170000 == 0o040000)
        }
    }

    /// Unmount wipes every key, subkeys and their OpenSSL contexts included: a subkey that was
    /// wiped refuses to work rather than sealing under a zeroed key.
    @Test func wipedKeysRefuseToSeal() throws {
        let keys = try ContainerKeys(master: try SecureBytes.random(count: 32), containerId: try Random.bytes(16))
        let file = try keys.fileCipher(contentId: 7)
        _ = try keys.metadata.seal([1, 2, 3], aad: [])
        _ = try file.seal([1, 2, 3], aad: [])
        keys.wipe()
        file.wipe()
        func fails(_ body: () throws -> Any) -> Bool {
            do {
                _ = try body()
                return false
            } catch { return true }
        }
        let metadataSeal = fails { try keys.metadata.seal([1, 2, 3], aad: []) }
        let fileSeal = fails { try file.seal([1, 2, 3], aad: []) }
        let metadataOpen = fails { try keys.metadata.open([UInt8](repeating: 0, count: 40), aad: []) }
        #expect(metadataSeal && fileSeal && metadataOpen)
    }

    @Test func wrongPasswordFailsAndLeavesHeaderUntouched() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let headerPath = made.root + "/" + ContainerHeader.fileName
            let before = fileBytes(headerPath)
            #expect(!before.isEmpty)
            let opened = try Container.open(at: made.root)
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(passwordSecret("wrong password")) }
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(passwordSecret("")) }
            expectError(ContainerError.noMatchingSlot) { _ = try opened.unlock(Secret(kind: .keyFile, bytes: secure("anything"))) }
            #expect(fileBytes(headerPath) == before, "a failed unlock must not rewrite the header")
            let names = try FileManager.default.contentsOfDirectory(atPath: made.root)
            let leftovers = names.filter { $0.hasSuffix(".tmp") }
            #expect(leftovers.isEmpty)
        }
    }

    @Test func recoveryKeyUnlocks() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let text = try #require(made.recoveryKey)
            // 64 hex digits in 8 groups of 8.
            #expect(text.split(separator: "-").count == 8)
            let digits = text.filter { $0 != "-" }
            #expect(digits.count == 64)
            let recoverySlot = try required(made.container.header.slots.first(where: { $0.kind == .recovery }))
            let opened = try Container.open(at: made.root)
            let secret = Secret.fromPassword(SecureBytes(copying: Array(text.utf8)))
            #expect(secret.kind == .recoveryKey)
            let (keys, slotId) = try opened.unlock(secret)
            #expect(slotId == recoverySlot.id)
            #expect(keys.containerId == made.keys.containerId)
            // Upper case, spaces and a trailing newline are accepted as well.
            let sloppy = text.uppercased().replacingOccurrences(of: "-", with: " ") + "\n"
            #expect(try opened.unlock(Secret.fromPassword(secure(sloppy))).slotId == recoverySlot.id)
            // A different recovery key fails.
            var wrong = Array(text)
            wrong[0] = wrong[0] == "0" ? "1" : "0"
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(Secret.fromPassword(secure(String(wrong)))) }
        }
    }

    @Test func containerWithoutRecoveryKey() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir, recovery: false)
            #expect(made.recoveryKey == nil)
            #expect(made.container.header.slots.map(\.kind) == [.password])
            let opened = try Container.open(at: made.root)
            let fake = RecoveryKey.format(try SecureBytes.random(count: 32))
            expectError(ContainerError.noMatchingSlot) { _ = try opened.unlock(Secret.fromPassword(secure(fake))) }
        }
    }

    @Test func addRemoveReplaceSlots() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let c = made.container
            let originalSlot = try required(c.header.slots.first(where: { $0.kind == .password })).id
            let second = try c.addSlot(kind: .password, secret: secure("second password"), kdf: testKDF, label: "second", keys: made.keys)
            let keyFileBytes = try Random.bytes(64)
            let keyFileSlot = try c.addSlot(kind: .keyfile, secret: SecureBytes(copying: keyFileBytes), kdf: testKDF, label: "usb", keys: made.keys)
            #expect(Set([originalSlot, second, keyFileSlot]).count == 3)

            var opened = try Container.open(at: made.root)
            #expect(opened.header.slots.count == 4)
            #expect(try opened.unlock(passwordSecret(testPassword)).slotId == originalSlot)
            #expect(try opened.unlock(passwordSecret("second password")).slotId == second)
            let kf = try opened.unlock(Secret(kind: .keyFile, bytes: SecureBytes(copying: keyFileBytes)))
            #expect(kf.slotId == keyFileSlot)
            #expect(kf.keys.containerId == made.keys.containerId)
            // A key file is not a password, even with the same bytes.
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(Secret(kind: .password, bytes: SecureBytes(copying: keyFileBytes))) }

            // Remove the second password and the key file.
            try c.removeSlot(id: second, keys: made.keys)
            try c.removeSlot(id: keyFileSlot, keys: made.keys)
            expectError(ContainerError.slotNotFound(keyFileSlot)) { try c.removeSlot(id: keyFileSlot, keys: made.keys) }
            opened = try Container.open(at: made.root)
            #expect(opened.header.slots.count == 2)
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(passwordSecret("second password")) }
            expectError(ContainerError.noMatchingSlot) { _ = try opened.unlock(Secret(kind: .keyFile, bytes: SecureBytes(copying: keyFileBytes))) }
            #expect(try opened.unlock(passwordSecret(testPassword)).slotId == originalSlot)

            // Replace (password change): same slot id, the old password fails, the new works.
            try c.replaceSlot(id: originalSlot, secret: secure("new password"), kdf: testKDF, keys: made.keys)
            // `opened` read the header before that change: its rewrite would undo it, so it is refused.
            expectError(ContainerError.headerChanged) {
                _ = try opened.addSlot(kind: .password, secret: secure("late"), kdf: testKDF, label: nil, keys: made.keys)
            }
            opened = try Container.open(at: made.root)
            let ids = opened.header.slots.map(\.id)
            #expect(ids.contains(originalSlot))
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(passwordSecret(testPassword)) }
            let unlocked = try opened.unlock(passwordSecret("new password"))
            #expect(unlocked.slotId == originalSlot)
            #expect(unlocked.keys.containerId == made.keys.containerId)
            // A replacement below the floor is refused and changes nothing.
            let before = fileBytes(made.root + "/" + ContainerHeader.fileName)
            expectError(ContainerError.weakKDF(KDFChoice.scrypt(logN: 15, r: 8, p: 1).description)) {
                try c.replaceSlot(id: originalSlot, secret: secure("x"), kdf: .scrypt(logN: 15, r: 8, p: 1), keys: made.keys)
            }
            expectError(ContainerError.slotNotFound("0000000000000000")) {
                try c.replaceSlot(id: "0000000000000000", secret: secure("x"), kdf: testKDF, keys: made.keys)
            }
            #expect(fileBytes(made.root + "/" + ContainerHeader.fileName) == before)
            // addSlot refuses weak parameters too.
            expectError(ContainerError.weakKDF(KDFChoice.argon2id(iterations: 1, memoryKiB: 65536, parallelism: 1).description)) {
                try c.addSlot(
                    kind: .password, secret: secure("x"), kdf: .argon2id(iterations: 1, memoryKiB: 65536, parallelism: 1), label: nil, keys: made.keys
                )
            }
        }
    }

    @Test func removingTheLastSlotIsRefused() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let c = made.container
            let recovery = try required(c.header.slots.first(where: { $0.kind == .recovery })).id
            let password = try required(c.header.slots.first(where: { $0.kind == .password })).id
            try c.removeSlot(id: recovery, keys: made.keys)
            expectError(ContainerError.lastSlot) { try c.removeSlot(id: password, keys: made.keys) }
            let opened = try Container.open(at: made.root)
            #expect(opened.header.slots.map(\.id) == [password])
            #expect(try opened.unlock(passwordSecret(testPassword)).slotId == password)
            expectError(ContainerError.noMatchingSlot) { _ = try opened.unlock(Secret.fromPassword(secure(made.recoveryKey ?? ""))) }
        }
    }

    @Test func createRefusesNonEmptyDirectoryAndWeakKDF() throws {
        try withTempDir { dir in
            let root = dir + "/busy"
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
            #expect(FileManager.default.createFile(atPath: root + "/other", contents: Data("x".utf8)))
            expectError(ContainerError.alreadyExists(root)) { _ = try Container.create(at: root, password: secure("p"), options: fastOptions()) }
            #expect(FileManager.default.fileExists(atPath: root + "/other"), "create must not touch a non-empty directory")
            var weak = fastOptions()
            weak.kdf = .scrypt(logN: 15, r: 8, p: 1)
            expectError(ContainerError.weakKDF(KDFChoice.scrypt(logN: 15, r: 8, p: 1).description)) {
                _ = try Container.create(at: dir + "/weak", password: secure("p"), options: weak)
            }
            #expect(!FileManager.default.fileExists(atPath: dir + "/weak"))
            // An existing empty directory is fine.
            let empty = dir + "/empty"
            try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
            _ = try Container.create(at: empty, password: secure("p"), options: fastOptions(recovery: false))
            #expect(FileManager.default.fileExists(atPath: empty + "/" + ContainerHeader.fileName))
            #expect(FileManager.default.fileExists(atPath: empty + "/" + SQLiteBackend.fileName))
        }
    }

    @Test func headerFileIsPrivate() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            var st = stat()
            #expect(stat(made.root + "/" + ContainerHeader.fileName, &st) == 0)
            #expect(st.st_mode & 0o077 == 0, "header readable by others: \(String(st.st_mode, radix: 8))")
            #expect(stat(made.root, &st) == 0)
            #expect(st.st_mode & 0o077 == 0, "container dir open to others: \(String(st.st_mode, radix: 8))")
        }
    }

    @Test func movedContainerStillOpens() throws {
        try withTempDir { dir in
            let a = dir + "/A", bDir = dir + "/B"
            try FileManager.default.createDirectory(atPath: a, withIntermediateDirectories: false)
            try FileManager.default.createDirectory(atPath: bDir, withIntermediateDirectories: false)
            let made = try makeContainer(in: a)
            // Put something in the store before moving.
            do {
                let store = try EntityStore.open(at: try made.container.storePath(), keys: made.keys)
                try store.putInode(42, sampleInode(size: 7))
                store.close()
            }
            try FileManager.default.moveItem(atPath: made.root, toPath: bDir + "/vault")
            let opened = try Container.open(at: bDir + "/vault")
            #expect(opened.root == bDir + "/vault")
            let keys = try opened.unlock(passwordSecret(testPassword)).keys
            let storePath = try opened.storePath()
            #expect(storePath == bDir + "/vault/" + SQLiteBackend.fileName)
            #expect(!storePath.hasPrefix(a))
            let store = try EntityStore.open(at: storePath, keys: keys)
            defer { store.close() }
            let root = try #require(try store.inode(EntityStore.rootInode))
            #expect(root.mode == 0o040755)
            #expect(try store.inode(42)?.size == 7)
        }
    }
}
