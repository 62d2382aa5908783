import Testing
import CofferCrypto
#if canImport(Glibc)
    import Glibc
#endif

@Suite struct HKDFTests {
    struct Vector: Sendable, CustomStringConvertible {
        let name: String, ikm: [UInt8], salt: [UInt8], info: [UInt8], okm: String
        var description: String { name }
    }

    /// RFC 5869 appendix A, test cases 1-3 (SHA-256).
    static let vectors: [Vector] = [
        Vector(
            name: "RFC 5869 A.1", ikm: [UInt8](repeating: 0x0b, count: 22), salt: Array(0x00...0x0c), info: Array(0xf0...0xf9),
            okm: "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"),
        Vector(
            name: "RFC 5869 A.2", ikm: Array(0x00...0x4f), salt: Array(0x60...0xaf), info: Array(0xb0...0xff),
            okm:
                "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87"
        ),
        Vector(
            name: "RFC 5869 A.3 (empty salt and info)", ikm: [UInt8](repeating: 0x0b, count: 22), salt: [], info: [],
            okm: "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")
    ]

    @Test(arguments: vectors)
    func knownAnswer(_ v: Vector) throws {
        let expected = h(v.okm)
        #expect(try HKDF.derive(ikm: v.ikm, salt: v.salt, info: v.info, count: expected.count).hexString == v.okm)
        let key = try HKDF.deriveKey(from: SecureBytes(copying: v.ikm), salt: v.salt, info: v.info, count: expected.count)
        #expect(key.unsafeCopyBytes() == expected)
    }

    @Test func infoSeparatesKeys() throws {
        let master = try SecureBytes.random(count: 32)
        let a = try HKDF.deriveKey(from: master, salt: [], info: bytes("file"), count: 32)
        let b = try HKDF.deriveKey(from: master, salt: [], info: bytes("name"), count: 32)
        #expect(!a.constantTimeEquals(b))
    }

    @Test(arguments: [0, -1, 255 * 32 + 1])
    func badLengthsThrow(count: Int) {
        #expect(throws: CryptoError.self) { try HKDF.derive(ikm: [1, 2, 3], salt: [], info: [], count: count) }
    }
}

@Suite struct ScryptTests {
    /// RFC 7914 section 12. The fourth vector (N=2^20, r=8, p=1) needs 1 GiB of memory and several
    /// seconds, so it runs only when COFFER_SLOW_TESTS is set, to keep CI machines with little RAM green.
    @Test func rfc7914Vector1() throws {
        let key = try Scrypt.deriveKey(
            password: SecureBytes(copying: bytes("")), salt: bytes(""), n: 16, r: 1, p: 1,
            count: 64, allowWeak: true)
        #expect(
            key.unsafeCopyBytes().hexString
                == "77d6576238657b203b19ca42c18a0497f16b4844e3074ae8dfdffa3fede21442fcd0069ded0948f8326a753a0fc81f17e8d3e0fb2e0d3628cf35e20c38d18906")
    }

    @Test func rfc7914Vector2() throws {
        let key = try Scrypt.deriveKey(
            password: SecureBytes(copying: bytes("password")), salt: bytes("NaCl"), n: 1024, r: 8, p: 16,
            count: 64, allowWeak: true)
        #expect(
            key.unsafeCopyBytes().hexString
                == "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b3731622eaf30d92e22a3886ff109279d9830dac727afb94a83ee6d8360cbdfa2cc0640")
    }

    @Test func rfc7914Vector3() throws {
        let key = try Scrypt.deriveKey(
            password: SecureBytes(copying: bytes("pleaseletmein")), salt: bytes("SodiumChloride"),
            n: 16384, r: 8, p: 1, count: 64, allowWeak: true)
        #expect(
            key.unsafeCopyBytes().hexString
                == "7023bdcb3afd7348461c06cd81fd38ebfda8fbba904f8e3ea9b543f6545da1f2d5432955613f0fcf62d49705242a9af9e61e85dc0d651e40dfcf017b45575887")
    }

    @Test(.enabled(if: getenv("COFFER_SLOW_TESTS") != nil, "needs 1 GiB; set COFFER_SLOW_TESTS=1"))
    func rfc7914Vector4() throws {
        let key = try Scrypt.deriveKey(
            password: SecureBytes(copying: bytes("pleaseletmein")), salt: bytes("SodiumChloride"),
            n: 1 << 20, r: 8, p: 1, count: 64)
        #expect(
            key.unsafeCopyBytes().hexString
                == "2101cb9b6a511aaeaddbbe09cf70f881ec568d574a2ffd4dabe5ee9820adaa478e56fd8f4ba5d09ffa1c6d927c40f4c337304049e8a952fbcbf45c6fa77a41a4")
    }

    @Test func refusesWeakParametersUnlessAllowed() throws {
        let password = SecureBytes(copying: bytes("pw"))
        for (n, r): (UInt64, UInt64) in [(1 << 15, 8), (1 << 16, 4), (16, 1)] {
            #expect(throws: CryptoError.self, "N=\(n) r=\(r)") {
                try Scrypt.deriveKey(password: password, salt: bytes("salt"), n: n, r: r, p: 1, count: 32)
            }
        }
        // The same weak parameters are accepted with allowWeak.
        #expect(try Scrypt.deriveKey(password: password, salt: bytes("salt"), n: 16, r: 1, p: 1, count: 32, allowWeak: true).count == 32)
    }

    @Test func gocryptfsStrengthWorksAboveOpenSSLsDefaultMemoryCap() throws {
        // N=2^17, r=8 needs 128 MiB, above OpenSSL's 32 MiB default maxmem.
        let key = try Scrypt.deriveKey(password: SecureBytes(copying: bytes("pw")), salt: bytes("salt"), n: 1 << 17, r: 8, p: 1, count: 32)
        #expect(key.count == 32)
    }

    @Test func refusesMalformedParameters() {
        let password = SecureBytes(copying: bytes("pw"))
        let bad: [(UInt64, UInt64, UInt64, Int)] = [
            (0, 8, 1, 32), (1, 8, 1, 32), (1000, 8, 1, 32), ((1 << 16) + 1, 8, 1, 32),
            (1 << 16, 0, 1, 32), (1 << 16, 8, 0, 32), (1 << 16, 8, 1, 0),
            (1 << 62, UInt64.max / 2, 1, 32)
        ]
        for (n, r, p, count) in bad {
            #expect(throws: CryptoError.self, "N=\(n) r=\(r) p=\(p) count=\(count)") {
                try Scrypt.deriveKey(password: password, salt: bytes("salt"), n: n, r: r, p: p, count: count, allowWeak: true)
            }
        }
    }
}

@Suite struct Argon2idTests {
    /// RFC 9106 section 5.3.
    @Test func rfc9106Vector() throws {
        let tag = try Argon2id.derive(
            password: [UInt8](repeating: 0x01, count: 32), salt: [UInt8](repeating: 0x02, count: 16),
            secret: [UInt8](repeating: 0x03, count: 8), associatedData: [UInt8](repeating: 0x04, count: 12),
            iterations: 3, memoryKiB: 32, parallelism: 4, count: 32)
        #expect(tag.hexString == "0d640df58d78766c08c037a34a8b53c9d01ef0452d75b65eb52520e96b01e659")
    }

    @Test func deriveKeyMatchesFullFormWithoutSecretOrAD() throws {
        let salt = [UInt8](repeating: 0x02, count: 16)
        let key = try Argon2id.deriveKey(
            password: SecureBytes(copying: bytes("password")), salt: salt,
            iterations: 2, memoryKiB: 1024, parallelism: 2, count: 32)
        let plain = try Argon2id.derive(
            password: bytes("password"), salt: salt, secret: [], associatedData: [],
            iterations: 2, memoryKiB: 1024, parallelism: 2, count: 32)
        #expect(key.unsafeCopyBytes() == plain)
        let other = try Argon2id.deriveKey(
            password: SecureBytes(copying: bytes("passwore")), salt: salt,
            iterations: 2, memoryKiB: 1024, parallelism: 2, count: 32)
        #expect(!key.constantTimeEquals(other))
    }

    @Test func badParametersThrowInsteadOfCrashing() {
        let password = SecureBytes(copying: bytes("pw"))
        let salt = [UInt8](repeating: 7, count: 16)
        let cases: [(salt: [UInt8], t: UInt32, m: UInt32, p: UInt32, count: Int)] = [
            (salt, 0, 1024, 1, 32),  // no iterations
            (salt, 1, 1024, 0, 32),  // no lanes
            (salt, 1, 7, 1, 32),  // below 8 KiB per lane
            (salt, 1, 31, 4, 32),  // below 8 KiB per lane, several lanes
            (Array(salt.prefix(7)), 1, 1024, 1, 32),  // salt too short
            (salt, 1, 1024, 1, 3),  // tag too short
            (salt, 1, 1024, 1, -1),  // negative length
            (salt, 1, 1024, 0x100_0000, 32)  // too many lanes
        ]
        for c in cases {
            #expect(throws: CryptoError.self, "t=\(c.t) m=\(c.m) p=\(c.p) count=\(c.count) salt=\(c.salt.count)") {
                try Argon2id.deriveKey(password: password, salt: c.salt, iterations: c.t, memoryKiB: c.m, parallelism: c.p, count: c.count)
            }
        }
    }
}
