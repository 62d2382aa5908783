import Dispatch
import Synchronization
import Testing
import CofferCrypto

@Suite struct HMACSHA256Tests {
    struct Vector: Sendable, CustomStringConvertible {
        let name: String, key: [UInt8], data: [UInt8], mac: String
        var description: String { name }
    }

    /// RFC 4231 test cases 1-4, 6, 7 (case 5 tests truncated output, which this API does not offer).
    static let vectors: [Vector] = [
        Vector(
            name: "RFC 4231 case 1", key: [UInt8](repeating: 0x0b, count: 20), data: bytes("Hi There"),
            mac: "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        Vector(
            name: "RFC 4231 case 2", key: bytes("Jefe"), data: bytes("what do ya want for nothing?"),
            mac: "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        Vector(
            name: "RFC 4231 case 3", key: [UInt8](repeating: 0xaa, count: 20), data: [UInt8](repeating: 0xdd, count: 50),
            mac: "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
        Vector(
            name: "RFC 4231 case 4", key: Array(0x01...0x19), data: [UInt8](repeating: 0xcd, count: 50),
            mac: "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
        Vector(
            name: "RFC 4231 case 6", key: [UInt8](repeating: 0xaa, count: 131),
            data: bytes("Test Using Larger Than Block-Size Key - Hash Key First"),
            mac: "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
        Vector(
            name: "RFC 4231 case 7", key: [UInt8](repeating: 0xaa, count: 131),
            data: bytes(
                "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm."
            ),
            mac: "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2")
    ]

    @Test(arguments: vectors)
    func knownAnswer(_ v: Vector) {
        #expect(HMACSHA256.authenticate(key: v.key, message: v.data).hexString == v.mac)
        // A keyed instance reused for several messages gives the same answer every time
        // (the per-message re-initialisation must keep the key and reset the state).
        let mac = HMACSHA256(key: SecureBytes(copying: v.key))
        #expect(mac.authenticate(bytes("something else")) != h(v.mac))
        #expect(mac.authenticate(v.data).hexString == v.mac)
        #expect(mac.authenticate(v.data).hexString == v.mac)
    }

    @Test func emptyKeyAndMessage() {
        // HMAC-SHA256("", "") is a widely published value.
        #expect(
            HMACSHA256.authenticate(key: [], message: []).hexString
                == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
    }

    @Test func concurrentUseGivesConsistentTags() {
        let mac = HMACSHA256(key: SecureBytes(copying: bytes("name key")))
        let expected = (0..<100).map { HMACSHA256.authenticate(key: bytes("name key"), message: bytes("file-\($0).txt")) }
        let mismatches = Mutex(0)
        DispatchQueue.concurrentPerform(iterations: 32) { _ in
            for i in 0..<100 where mac.authenticate(bytes("file-\(i).txt")) != expected[i] {
                mismatches.withLock { $0 += 1 }
            }
        }
        #expect(mismatches.withLock { $0 } == 0)
    }
}

@Suite struct SHA256Tests {
    @Test func knownAnswers() {
        #expect(SHA256.hash([]).hexString == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(SHA256.hash(bytes("abc")).hexString == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            SHA256.hash(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")).hexString
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }
}
