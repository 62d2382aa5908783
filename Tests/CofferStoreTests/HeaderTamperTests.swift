import CofferCrypto
import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore

@Suite("Container header: tampering is refused with a typed error")
struct HeaderTamperTests {
    @Test func flippedMACCharacter() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { h in
                var chars = Array(h.mac)
                chars[0] = chars[0] == "A" ? "B" : "A"  // still valid base64 of 32 bytes
                h.mac = String(chars)
            }
            let opened = try Container.open(at: made.root)
            expectError(ContainerError.headerTampered) { _ = try opened.unlock(passwordSecret(testPassword)) }
            expectError(ContainerError.headerTampered) { _ = try opened.unlock(Secret.fromPassword(secure(made.recoveryKey ?? ""))) }
        }
    }

    @Test func macThatIsNotBase64OrMissing() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.mac = "not base64!" }
            expectError(ContainerError.headerDamaged("mac")) { _ = try Container.open(at: made.root) }
            try editHeader(made.root) { $0.mac = "" }
            expectError(ContainerError.headerDamaged("mac")) { _ = try Container.open(at: made.root) }
        }
    }

    /// A slot's salt or wrapped key that cannot be what it says, or a store outside the container, is damage,
    /// said before any secret is asked, not a wrong password or a tampered header found after the key derivation.
    @Test func slotSaltAndWrappedKeyThatCannotBeRight() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let good = try #require(try Container.open(at: made.root).header.slots.first)
            for salt in ["!!!", "", "AAAA"] {
                try editHeader(made.root) { $0.slots[0].kdf.salt = salt }
                expectError(ContainerError.headerDamaged("kdf salt")) { _ = try Container.open(at: made.root) }
            }
            try editHeader(made.root) { $0.slots[0].kdf.salt = good.kdf.salt }
            for wrapped in ["AAAA", "", "not base64"] {
                try editHeader(made.root) { $0.slots[0].wrappedKey = wrapped }
                expectError(ContainerError.headerDamaged("wrapped key")) { _ = try Container.open(at: made.root) }
            }
            try editHeader(made.root) { $0.slots[0].wrappedKey = good.wrappedKey }
            let store = try Container.open(at: made.root).header.store
            for outside in ["/etc/passwd", "../../etc/passwd", "", String(repeating: "a/", count: 3000), "st\0re"] {
                try editHeader(made.root) { $0.store = outside }
                expectError(ContainerError.headerDamaged("store path")) { _ = try Container.open(at: made.root) }
            }
            try editHeader(made.root) { $0.store = store }
            _ = try Container.open(at: made.root).unlock(passwordSecret(testPassword))
        }
    }

    @Test func untouchedRewriteStillOpens() throws {
        // The control for the edits below: rewriting the same header through the same path opens.
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { _ in }
            let opened = try Container.open(at: made.root)
            #expect(try opened.unlock(passwordSecret(testPassword)).keys.containerId == made.keys.containerId)
        }
    }

    @Test(arguments: [4096, 16384, 131072])
    func changedChunkSize(to size: Int) throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.chunkSize = size }
            let opened = try Container.open(at: made.root)  // structurally fine ...
            #expect(opened.header.chunkSize == size)
            expectError(ContainerError.headerTampered) { _ = try opened.unlock(passwordSecret(testPassword)) }  // ... but not authentic
        }
    }

    @Test func chunkSizeOutsideTheAllowedSet() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.chunkSize = 1 << 30 }
            expectError(ContainerError.headerDamaged("chunk size \(1 << 30)")) { _ = try Container.open(at: made.root) }
        }
    }

    @Test func addedFeatureFlag() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.features.append("plaintext-names") }
            expectError(ContainerError.unsupportedFeature("plaintext-names")) { _ = try Container.open(at: made.root) }
        }
    }

    @Test func changedCipher() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.cipher = "AES-128-CTR" }
            expectError(ContainerError.unsupportedCipher("AES-128-CTR")) { _ = try Container.open(at: made.root) }
        }
    }

    @Test func changedVersionAndFormat() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.version = 2 }
            expectError(ContainerError.unsupportedVersion(2)) { _ = try Container.open(at: made.root) }
            try editHeader(made.root) {
                $0.version = 1
                $0.format = "something-else"
            }
            if case .headerDamaged? = containerError({ _ = try Container.open(at: made.root) }) {
            } else {
                Issue.record("a foreign format name must be refused as a damaged header")
            }
        }
    }

    @Test func weakenedSlotKDFBelowTheFloor() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf.logN = 15
            }
            expectError(ContainerError.weakKDF(KDFChoice.scrypt(logN: 15, r: 8, p: 1).description)) { _ = try Container.open(at: made.root) }
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf.logN = 16
                h.slots[i].kdf.r = 1
            }
            expectError(ContainerError.weakKDF(KDFChoice.scrypt(logN: 16, r: 1, p: 1).description)) { _ = try Container.open(at: made.root) }
            // Switching the slot to an argon2id below the floor is refused as well.
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf = KDFParameters(algorithm: "argon2id", salt: h.slots[i].kdf.salt, iterations: 1, memoryKiB: 8, parallelism: 1)
            }
            expectError(ContainerError.weakKDF(KDFChoice.argon2id(iterations: 1, memoryKiB: 8, parallelism: 1).description)) {
                _ = try Container.open(at: made.root)
            }
        }
    }

    /// Beyond the ceiling is not "weaker than the minimum": the error says what Coffer runs.
    @Test func slotKDFBeyondTheCeilingIsOutOfRange() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf = KDFParameters(
                    algorithm: "argon2id", salt: h.slots[i].kdf.salt, iterations: 3, memoryKiB: 65536, parallelism: 100_000)
            }
            expectError(ContainerError.kdfOutOfRange(KDFChoice.argon2id(iterations: 3, memoryKiB: 65536, parallelism: 100_000).description)) {
                _ = try Container.open(at: made.root)
            }
        }
    }

    /// A field of the wrong type, or a number its field cannot hold, is named.
    @Test func aHeaderFieldOfTheWrongTypeIsNamed() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let path = made.root + "/" + ContainerHeader.fileName
            let original = try String(contentsOfFile: path, encoding: .utf8)
            let r = try #require(original.range(of: #""r" : \d+"#, options: .regularExpression), "\(original)")
            let cases = [
                (original.replacingCharacters(in: r, with: #""r" : 1099511627776"#), "slots[0].kdf.r: 1099511627776 is not a whole number"),
                (original.replacingCharacters(in: r, with: #""r" : "big""#), "slots[0].kdf.r: not a number"),
                (original.replacingOccurrences(of: #""chunkSize" : 65536"#, with: #""chunkSize" : "x""#), "chunkSize: not a number")
            ]
            for (text, said) in cases {
                try text.write(toFile: path, atomically: true, encoding: .utf8)
                let e = containerError { _ = try Container.open(at: made.root) }
                #expect(e?.description.contains(said) == true, "\(String(describing: e))")
            }
        }
    }

    @Test func changedSlotKDFAboveTheFloor() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf.r = 9  // still above the floor, but a different KEK
            }
            let opened = try Container.open(at: made.root)
            expectError(ContainerError.wrongSecret) { _ = try opened.unlock(passwordSecret(testPassword)) }
        }
    }

    @Test func changedSlotSaltOrWrappedKey() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let original = try readHeader(made.root)
            try editHeader(made.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf.salt = Data(repeating: 7, count: 32).base64EncodedString()
            }
            expectError(ContainerError.wrongSecret) { _ = try Container.open(at: made.root).unlock(passwordSecret(testPassword)) }
            try editHeader(made.root) { h in
                h = original
                let i = h.slots.firstIndex { $0.kind == .password }!
                var wrapped = [UInt8](Data(base64Encoded: h.slots[i].wrappedKey)!)
                wrapped[20] ^= 0x01
                h.slots[i].wrappedKey = Data(wrapped).base64EncodedString()
            }
            expectError(ContainerError.wrongSecret) { _ = try Container.open(at: made.root).unlock(passwordSecret(testPassword)) }
            // Relabelling a slot is an edit of the authenticated header.
            try editHeader(made.root) { h in
                h = original
                h.slots[0].label = "evil"
            }
            expectError(ContainerError.headerTampered) { _ = try Container.open(at: made.root).unlock(passwordSecret(testPassword)) }
            // Changing a slot's kind breaks its binding.
            try editHeader(made.root) { h in
                h = original
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kind = .keyfile
            }
            expectError(ContainerError.wrongSecret) {
                _ = try Container.open(at: made.root).unlock(Secret(kind: .keyFile, bytes: secure(testPassword)))
            }
            // Short salt: damage, said before any secret is used.
            try editHeader(made.root) { h in
                h = original
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i].kdf.salt = Data([1, 2, 3]).base64EncodedString()
            }
            expectError(ContainerError.headerDamaged("kdf salt")) { _ = try Container.open(at: made.root) }
            // Back to the original: opens again (the edits above were the only cause).
            try editHeader(made.root) { h in h = original }
            #expect(try Container.open(at: made.root).unlock(passwordSecret(testPassword)).keys.containerId == made.keys.containerId)
        }
    }

    @Test func slotCopiedFromAnotherContainer() throws {
        try withTempDir { dir in
            let a = try makeContainer(in: dir, name: "a")
            let b = try makeContainer(in: dir, name: "b")  // same password
            let bSlot = try required(b.container.header.slots.first(where: { $0.kind == .password }))
            let aOriginal = try readHeader(a.root)

            // Replace A's password slot with B's: the slot is bound to B's container id.
            try editHeader(a.root) { h in
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i] = bSlot
            }
            expectError(ContainerError.wrongSecret) { _ = try Container.open(at: a.root).unlock(passwordSecret(testPassword)) }

            // Put B's slot first, keeping A's: B's does not unwrap, A's does, and the header MAC then fails.
            try editHeader(a.root) { h in
                h = aOriginal
                h.slots.insert(bSlot, at: 0)
            }
            expectError(ContainerError.headerTampered) { _ = try Container.open(at: a.root).unlock(passwordSecret(testPassword)) }

            // Even with B's container id copied as well, B's master key cannot authenticate A's header.
            try editHeader(a.root) { h in
                h = aOriginal
                h.containerId = b.container.header.containerId
                let i = h.slots.firstIndex { $0.kind == .password }!
                h.slots[i] = bSlot
            }
            expectError(ContainerError.headerTampered) { _ = try Container.open(at: a.root).unlock(passwordSecret(testPassword)) }
        }
    }

    @Test func storePathPointingOutside() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            try editHeader(made.root) { $0.store = "../elsewhere/store.db" }
            // Refused when the header is read, before any secret (the MAC would say so only after the KDF).
            expectError(ContainerError.headerDamaged("store path")) { _ = try Container.open(at: made.root) }
        }
    }

    @Test func garbageAndStructurallyBrokenHeaders() throws {
        try withTempDir { dir in
            let made = try makeContainer(in: dir)
            let path = made.root + "/" + ContainerHeader.fileName
            let original = fileBytes(path)
            let garbage: [[UInt8]] = [
                [], b("{"), b("null"), b("[]"), b("{}"), [0xFF, 0xFE, 0x00], b("{\"format\": 1}"),
                Array(original.prefix(original.count / 2))
            ]
            for g in garbage {
                try Data(g).write(to: URL(fileURLWithPath: path))
                if case .headerDamaged? = containerError({ _ = try Container.open(at: made.root) }) {
                } else {
                    Issue.record("garbage header \(String(decoding: g, as: UTF8.self).prefix(40)) was not refused as damaged")
                }
            }
            // Too large to be a header.
            try Data(count: (1 << 20) + 1).write(to: URL(fileURLWithPath: path))
            expectError(ContainerError.headerDamaged("header file is too large")) { _ = try Container.open(at: made.root) }
            // Bad container id / no slots.
            try Data(original).write(to: URL(fileURLWithPath: path))
            try editHeader(made.root) { $0.containerId = "abcd" }
            expectError(ContainerError.headerDamaged("container id")) { _ = try Container.open(at: made.root) }
            try Data(original).write(to: URL(fileURLWithPath: path))
            try editHeader(made.root) { $0.slots = [] }
            expectError(ContainerError.headerDamaged("no key slots")) { _ = try Container.open(at: made.root) }
            try Data(original).write(to: URL(fileURLWithPath: path))
            try editHeader(made.root) { $0.slots[0].kdf.algorithm = "md5" }
            expectError(ContainerError.headerDamaged("unknown KDF md5")) { _ = try Container.open(at: made.root) }
        }
    }

    @Test func missingDirectoryAndNonContainers() throws {
        try withTempDir { dir in
            expectError(ContainerError.notFound(dir + "/nope")) { _ = try Container.open(at: dir + "/nope") }
            try FileManager.default.createDirectory(atPath: dir + "/empty", withIntermediateDirectories: false)
            expectError(ContainerError.notAContainer(dir + "/empty")) { _ = try Container.open(at: dir + "/empty") }
            #expect(FileManager.default.createFile(atPath: dir + "/file", contents: Data("x".utf8)))
            expectError(ContainerError.notADirectory(dir + "/file")) { _ = try Container.open(at: dir + "/file") }
        }
    }
}
