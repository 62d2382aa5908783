import Testing
@_spi(Testing) import CofferCrypto
#if canImport(Glibc)
    import Glibc
#endif

@Suite struct SecureBytesTests {
    @Test func descriptionNeverShowsTheBytes() {
        let secret = SecureBytes(copying: [0xde, 0xad, 0xbe, 0xef, 0x41, 0x42])
        #expect(secret.description == "SecureBytes(6 bytes)")
        #expect(secret.debugDescription == "SecureBytes(6 bytes)")
        #expect("\(secret)" == "SecureBytes(6 bytes)")
        #expect(String(reflecting: secret) == "SecureBytes(6 bytes)")
        for rendering in [secret.description, String(reflecting: secret)] {
            #expect(!rendering.lowercased().contains("dead"))
            #expect(!rendering.contains("222"))  // 0xde in decimal
            #expect(!rendering.contains("AB"))
        }
    }

    @Test func zeroFilledAndCopying() {
        #expect(SecureBytes(count: 100).unsafeCopyBytes() == [UInt8](repeating: 0, count: 100))
        #expect(SecureBytes(count: 0).count == 0)
        #expect(SecureBytes(copying: [1, 2, 3]).unsafeCopyBytes() == [1, 2, 3])
        #expect(SecureBytes(copying: [UInt8](repeating: 9, count: 5000)).unsafeCopyBytes() == [UInt8](repeating: 9, count: 5000))
        // A non-contiguous collection goes through the element-by-element path.
        #expect(SecureBytes(copying: (1...4).lazy.map { UInt8($0) }).unsafeCopyBytes() == [1, 2, 3, 4])
    }

    @Test func lockedWhenRunningAsRoot() throws {
        let secret = try SecureBytes.random(count: 32)
        if getuid() == 0 {
            #expect(secret.isLocked)
        }
        #expect(secret.count == 32)
    }

    @Test func randomKeysDiffer() throws {
        let a = try SecureBytes.random(count: 32), b = try SecureBytes.random(count: 32)
        #expect(!a.constantTimeEquals(b))
        #expect(a.unsafeCopyBytes() != [UInt8](repeating: 0, count: 32))
    }

    @Test func constantTimeEquals() {
        let a = SecureBytes(copying: [1, 2, 3]), b = SecureBytes(copying: [1, 2, 3])
        #expect(a.constantTimeEquals(b))
        #expect(!a.constantTimeEquals(SecureBytes(copying: [1, 2, 4])))
        #expect(!a.constantTimeEquals(SecureBytes(copying: [1, 2])))
        #expect(SecureBytes(count: 0).constantTimeEquals(SecureBytes(count: 0)))
    }

    @Test func wipeZeroesTheRealStorage() {
        let secret = SecureBytes(count: 48)
        secret.withUnsafeMutableBytes { for i in $0.indices { $0[i] = 0xA5 } }
        // Read the storage through its own address before and after, not a copy.
        let before = secret.withUnsafeBytes { Array($0) }
        #expect(before == [UInt8](repeating: 0xA5, count: 48))
        secret.wipe()
        secret.withUnsafeBytes { storage in
            #expect(storage.count == 48)
            #expect(storage.allSatisfy { $0 == 0 })
        }
        secret.wipe()  // idempotent
        #expect(secret.unsafeCopyBytes() == [UInt8](repeating: 0, count: 48))
    }

    @Test func releasedMemoryIsZeroed() throws {
        var watch: SecureBytes.ReleaseWatch?
        do {
            let secret = try SecureBytes.random(count: 64)
            secret.withUnsafeMutableBytes { $0[0] = 0xFF }  // certainly non-zero
            watch = SecureBytes.watchRelease(of: secret)
            let w = try #require(watch)
            #expect(SecureBytes.releaseAudit(w) == nil)  // still alive
            withExtendedLifetime(secret) {}
        }
        let w = try #require(watch)
        let audit = try #require(SecureBytes.releaseAudit(w))
        #expect(audit.hadDataBeforeRelease)  // the deinit saw the key ...
        #expect(audit.zeroedAtRelease)  // ... and the storage was zero before it was unmapped
    }

    @Test func releasedPagesOfTheirOwnAreZeroed() throws {
        // Larger than a slab slot: a mapping of its own, zeroed before it is unmapped.
        var watch: SecureBytes.ReleaseWatch?
        do {
            let secret = try SecureBytes.random(count: 5000)
            secret.withUnsafeMutableBytes { $0[4999] = 0xFF }
            watch = SecureBytes.watchRelease(of: secret)
            withExtendedLifetime(secret) {}
        }
        let w = try #require(watch)
        let audit = try #require(SecureBytes.releaseAudit(w))
        #expect(audit.hadDataBeforeRelease)
        #expect(audit.zeroedAtRelease)
    }

    @Test func smallSecretsShareLockedPagesAndComeBackZeroed() throws {
        var released: Set<UInt> = []
        do {
            // Many keys at once: each its own 64-byte slot, far fewer pages than keys.
            let keys = try (0..<300).map { _ in try SecureBytes.random(count: 32) }
            let addresses = keys.map { k in k.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) } }
            #expect(Set(addresses).count == keys.count)
            let sorted = addresses.sorted()
            #expect(zip(sorted, sorted.dropFirst()).allSatisfy { $1 - $0 >= 64 }, "slots overlap")
            let pageSize = UInt(sysconf(Int32(_SC_PAGESIZE)))
            #expect(Set(addresses.map { $0 / pageSize }).count <= keys.count / 32, "about one page per key")
            if getuid() == 0 { #expect(keys.allSatisfy { $0.isLocked }) }
            released = Set(addresses)
        }
        // Released slots are reused, and a reused slot starts out zero like a fresh page.
        let fresh = (0..<300).map { _ in SecureBytes(count: 64) }
        let reused = fresh.filter { f in released.contains(f.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }) }
        #expect(!reused.isEmpty, "no released slot was reused")
        #expect(fresh.allSatisfy { $0.unsafeCopyBytes() == [UInt8](repeating: 0, count: 64) })
    }

    @Test func constantTimeEqualFunction() {
        #expect(constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2, 0]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(constantTimeEqual([], []))
    }
}

@Suite struct RandomAndHexTests {
    @Test func randomBytes() throws {
        #expect(try Random.bytes(0) == [])
        let a = try Random.bytes(32), b = try Random.bytes(32)
        #expect(a.count == 32 && a != b)
        #expect(try Random.uint64() != Random.uint64())
        #expect(throws: CryptoError.self) { try Random.bytes(-1) }
        var buffer = [UInt8](repeating: 0, count: 64)
        try buffer.withUnsafeMutableBytes { try Random.fill($0) }
        #expect(buffer != [UInt8](repeating: 0, count: 64))
    }

    @Test func hex() {
        #expect([UInt8](hex: "00ff10Ab") == [0x00, 0xff, 0x10, 0xab])
        #expect([UInt8](hex: "") == [])
        #expect([UInt8](hex: "abc") == nil)
        #expect([UInt8](hex: "zz") == nil)
        #expect([UInt8](hex: "0x12") == nil)
        #expect([0x00, 0xff, 0x10, 0xab].hexString == "00ff10ab")
        let random: [UInt8] = (0...255).map { UInt8($0) }
        #expect([UInt8](hex: random.hexString) == random)
    }

    @Test func errorDescriptionsCarryNoSecrets() {
        #expect(CryptoError.authenticationFailed.description == "authentication failed")
        #expect(CryptoError.invalidKeyLength(expected: 32, actual: 16).description.contains("32"))
    }
}
