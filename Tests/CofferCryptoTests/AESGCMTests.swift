import Dispatch
import Synchronization
import Testing
@testable import CofferCrypto

@Suite struct AESGCMKnownAnswerTests {
    struct Vector: Sendable, CustomStringConvertible {
        let name: String, key: String, iv: String, plaintext: String, aad: String, ciphertext: String, tag: String
        var description: String { name }
    }

    /// McGrew & Viega, "The Galois/Counter Mode of Operation (GCM)", test cases 13-16 (AES-256).
    static let vectors: [Vector] = [
        Vector(
            name: "GCM test case 13", key: String(repeating: "00", count: 32), iv: String(repeating: "00", count: 12),
            plaintext: "", aad: "", ciphertext: "", tag: "530f8afbc74536b9a963b4f1c4cb738b"),
        Vector(
            name: "GCM test case 14", key: String(repeating: "00", count: 32), iv: String(repeating: "00", count: 12),
            plaintext: String(repeating: "00", count: 16), aad: "",
            ciphertext: "cea7403d4d606b6e074ec5d3baf39d18", tag: "d0d1c8a799996bf0265b98b5d48ab919"),
        Vector(
            name: "GCM test case 15",
            key: "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", iv: "cafebabefacedbaddecaf888",
            plaintext:
                "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255",
            aad: "",
            ciphertext:
                "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
            tag: "b094dac5d93471bdec1a502270e3cc6c"),
        Vector(
            name: "GCM test case 16 (with AAD)",
            key: "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", iv: "cafebabefacedbaddecaf888",
            plaintext: "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
            aad: "feedfacedeadbeeffeedfacedeadbeefabaddad2",
            ciphertext: "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
            tag: "76fc6ece0f4e1768cddf8853bb2d551b")
    ]

    @Test(arguments: vectors)
    func knownAnswer(_ v: Vector) throws {
        let gcm = try AESGCM(key: SecureBytes(copying: h(v.key)))
        let out = try gcm.sealForTesting(h(v.plaintext), nonce: h(v.iv), aad: h(v.aad))
        #expect(out.hexString == v.ciphertext + v.tag)
        // And the sealed layout nonce || ciphertext || tag opens back to the plaintext.
        let opened = try gcm.open(h(v.iv) + h(v.ciphertext) + h(v.tag), aad: h(v.aad))
        #expect(opened == h(v.plaintext))
    }
}

@Suite struct AESGCMBehaviourTests {
    let gcm: AESGCM
    init() throws { gcm = try AESGCM(key: SecureBytes.random(count: 32)) }

    @Test func constants() {
        #expect(AESGCM.keySize == 32 && AESGCM.nonceSize == 12 && AESGCM.tagSize == 16 && AESGCM.overhead == 28)
    }

    @Test(arguments: [0, 1, 15, 16, 17, 4096, 65536 + 3])
    func roundTrip(size: Int) throws {
        let plaintext = try Random.bytes(size)
        let aad = bytes("inode 42 block 7")
        let sealed = try gcm.seal(plaintext, aad: aad)
        #expect(sealed.count == size + AESGCM.overhead)
        if size >= 16 { #expect(Array(sealed[12..<(12 + size)]) != plaintext) }
        #expect(try gcm.open(sealed, aad: aad) == plaintext)

        // The into: form writes into caller memory and reports the length.
        var output = [UInt8](repeating: 0xEE, count: size + 5)
        let n = try sealed.withUnsafeBytes { s in
            try aad.withUnsafeBytes { a in try output.withUnsafeMutableBytes { try gcm.open(s, aad: a, into: $0) } }
        }
        #expect(n == size)
        #expect(Array(output[0..<size]) == plaintext)
    }

    @Test func wrongKeyLengthIsRejected() {
        #expect(throws: CryptoError.invalidKeyLength(expected: 32, actual: 16)) {
            try AESGCM(key: SecureBytes(count: 16))
        }
    }

    @Test func everyFlippedByteFailsAuthentication() throws {
        let plaintext = bytes("the quick brown fox jumps over the lazy dog")
        let aad = bytes("aad")
        let sealed = try gcm.seal(plaintext, aad: aad)
        for index in sealed.indices {
            var tampered = sealed
            tampered[index] ^= 0x01
            #expect(throws: CryptoError.authenticationFailed, "byte \(index)") { try gcm.open(tampered, aad: aad) }
        }
        // The context pool still works after all those failures.
        #expect(try gcm.open(sealed, aad: aad) == plaintext)
    }

    @Test func failedOpenZeroesCallerOutput() throws {
        let plaintext = [UInt8](repeating: 0x41, count: 64)
        var sealed = try gcm.seal(plaintext, aad: [])
        sealed[sealed.count - 1] ^= 0x80
        var output = [UInt8](repeating: 0xEE, count: 64)
        #expect(throws: CryptoError.authenticationFailed) {
            _ = try sealed.withUnsafeBytes { s in
                try output.withUnsafeMutableBytes { try gcm.open(s, aad: UnsafeRawBufferPointer(start: nil, count: 0), into: $0) }
            }
        }
        #expect(output == [UInt8](repeating: 0, count: 64))
    }

    @Test func wrongAADFails() throws {
        let sealed = try gcm.seal(bytes("secret"), aad: bytes("inode 1"))
        #expect(throws: CryptoError.authenticationFailed) { try gcm.open(sealed, aad: bytes("inode 2")) }
        #expect(throws: CryptoError.authenticationFailed) { try gcm.open(sealed, aad: []) }
    }

    @Test func wrongKeyFails() throws {
        let other = try AESGCM(key: SecureBytes.random(count: 32))
        let sealed = try gcm.seal(bytes("secret"), aad: [])
        #expect(throws: CryptoError.authenticationFailed) { try other.open(sealed, aad: []) }
    }

    @Test func truncatedInputFailsWithoutCrashing() throws {
        let sealed = try gcm.seal(bytes("hello"), aad: [])
        for length in 0..<AESGCM.overhead {
            #expect(throws: CryptoError.authenticationFailed, "length \(length)") {
                try gcm.open(Array(sealed.prefix(length)), aad: [])
            }
        }
        // Dropping bytes from a valid box (not just short inputs) also fails.
        #expect(throws: CryptoError.authenticationFailed) { try gcm.open(Array(sealed.dropLast()), aad: []) }
        #expect(throws: CryptoError.authenticationFailed) { try gcm.open(Array(sealed.dropFirst()), aad: []) }
    }

    @Test func outputTooSmallIsAParameterError() throws {
        let sealed = try gcm.seal([UInt8](repeating: 1, count: 10), aad: [])
        var output = [UInt8](repeating: 0, count: 9)
        #expect(throws: CryptoError.self) {
            _ = try sealed.withUnsafeBytes { s in
                try output.withUnsafeMutableBytes { try gcm.open(s, aad: UnsafeRawBufferPointer(start: nil, count: 0), into: $0) }
            }
        }
    }

    @Test func noncesDifferBetweenSeals() throws {
        let plaintext = bytes("same plaintext")
        let a = try gcm.seal(plaintext, aad: [])
        let b = try gcm.seal(plaintext, aad: [])
        #expect(Array(a.prefix(12)) != Array(b.prefix(12)))
        #expect(a != b)
    }

    @Test func keyIsCopiedAtInit() throws {
        let key = try SecureBytes.random(count: 32)
        let first = try AESGCM(key: key)
        let sealed = try first.seal(bytes("x"), aad: [])
        key.wipe()
        #expect(try first.open(sealed, aad: []) == bytes("x"))
    }

    @Test func concurrentSealAndOpenFromManyThreads() throws {
        let gcm = self.gcm
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 64) { thread in
            do {
                for round in 0..<200 {
                    let plaintext = [UInt8](repeating: UInt8(truncatingIfNeeded: thread), count: 100 + round)
                    let aad = bytes("thread \(thread) round \(round)")
                    let sealed = try gcm.seal(plaintext, aad: aad)
                    guard try gcm.open(sealed, aad: aad) == plaintext else {
                        failures.withLock { $0.append("mismatch in thread \(thread) round \(round)") }
                        return
                    }
                    if round % 50 == 0 {
                        var bad = sealed
                        bad[20] ^= 1
                        if (try? gcm.open(bad, aad: aad)) != nil {
                            failures.withLock { $0.append("tampered box opened in thread \(thread)") }
                        }
                    }
                }
            } catch {
                failures.withLock { $0.append("thread \(thread): \(error)") }
            }
        }
        #expect(failures.withLock { $0 } == [])
    }
}

extension AESGCM {
    /// Seals under a given nonce (the vectors' IVs): ciphertext || tag, no nonce prefix. Tests only:
    /// a fixed nonce used twice with one key gives the key stream away.
    func sealForTesting(_ plaintext: [UInt8], nonce: [UInt8], aad: [UInt8]) throws -> [UInt8] {
        guard nonce.count == Self.nonceSize else { throw CryptoError.invalidParameter("nonce must be \(Self.nonceSize) bytes") }
        let total = plaintext.count + Self.tagSize
        return try [UInt8](unsafeUninitializedCapacity: total) { buffer, initialized in
            try plaintext.withUnsafeBytes { p in
                try aad.withUnsafeBytes { a in
                    try nonce.withUnsafeBytes { n in try sealCore(p, aad: a, nonce: n, into: UnsafeMutableRawBufferPointer(buffer)) }
                }
            }
            initialized = total
        }
    }
}
