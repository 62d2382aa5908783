import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore

/// Seeded, bounded fuzzing of every decoder: random bytes and mutations of valid encodings must
/// give a value or a DecodeError, quickly. A value that decodes must re-encode to the same bytes
/// (the encodings are canonical), so a decoder cannot silently accept something it misreads.
@Suite("Decoder fuzzing (seeded)")
struct FuzzTests {
    static let iterations = 20_000

    struct Target: Sendable {
        let name: String
        /// Byte offsets (and widths) of length fields in a sample, for length inflation.
        let lengthFields: @Sendable ([UInt8]) -> [(offset: Int, width: Int)]
        let sample: @Sendable (inout SplitMix64) -> [UInt8]
        /// Decodes; on success returns the re-encoding of what was decoded (and the bytes it covered).
        let decode: @Sendable ([UInt8]) throws(DecodeError) -> (reencoded: [UInt8], consumed: Int)
    }

    static func randomPath(_ g: inout SplitMix64) -> StoredPath {
        let alphabet = b("abc/.-_é")
        let n = Int.random(in: 0...40, using: &g)
        var p = (0..<n).map { _ in alphabet.randomElement(using: &g)! }
        if Bool.random(using: &g) {
            // Keep relative values valid: no leading slash, no ".." component.
            while p.first == UInt8(ascii: "/") { p.removeFirst() }
            let parts = p.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).map { $0.elementsEqual(b("..")) ? b("x")[...] : $0 }
            return .relative(Array(parts.joined(separator: [UInt8(ascii: "/")])))
        }
        return .verbatim(p)
    }

    static func randomTime(_ g: inout SplitMix64) -> StoredTime {
        StoredTime(seconds: Int64.random(in: Int64.min...Int64.max, using: &g), nanoseconds: UInt32.random(in: 0..<1_000_000_000, using: &g))
    }

    static let targets: [Target] = [
        Target(
            name: "inode", lengthFields: { s in s.count > 80 ? [(79, 2)] : [] },
            sample: { g in
                let target: StoredPath? = Bool.random(using: &g) ? randomPath(&g) : nil
                return InodeTransformer().encode(
                    InodeRecord(
                        mode: UInt32.random(in: 0...UInt32.max, using: &g), uid: UInt32.random(in: 0...70000, using: &g),
                        gid: UInt32.random(in: 0...70000, using: &g), nlink: UInt32.random(in: 0...5, using: &g),
                        size: UInt64.random(in: 0...UInt64(Int64.max), using: &g), rdev: g.next(),
                        atime: randomTime(&g), mtime: randomTime(&g), ctime: randomTime(&g), contentId: g.next(), symlinkTarget: target))
            },
            decode: { bytes throws(DecodeError) in
                let t = InodeTransformer()
                return (t.encode(try t.decode(bytes)), bytes.count)
            }),
        Target(
            name: "dirent", lengthFields: { _ in [(1, 2)] },
            sample: { g in
                let name = (0..<Int.random(in: 1...255, using: &g)).map { _ in UInt8.random(in: 1...255, using: &g) }.map { $0 == 0x2F ? 0x30 : $0 }
                return DirectoryEntryTransformer().encode(
                    DirectoryEntryRecord(name: name, ino: g.next(), type: UInt32.random(in: 0...UInt32.max, using: &g)))
            },
            decode: { bytes throws(DecodeError) in
                let t = DirectoryEntryTransformer()
                return (t.encode(try t.decode(bytes)), bytes.count)
            }),
        Target(
            name: "xattr",
            lengthFields: { s in
                guard s.count >= 3 else { return [] }
                let n = Int(s[1]) << 8 | Int(s[2])
                return [(1, 2), (3 + n, 4)]
            },
            sample: { g in
                let name = g.bytes(Int.random(in: 0...255, using: &g))
                let value = g.bytes(Int.random(in: 0...(Bool.random(using: &g) ? 64 : 3000), using: &g))
                return ExtendedAttributeTransformer().encode(ExtendedAttributeRecord(name: name, value: value))
            },
            decode: { bytes throws(DecodeError) in
                let t = ExtendedAttributeTransformer()
                return (t.encode(try t.decode(bytes)), bytes.count)
            }),
        Target(
            name: "state", lengthFields: { _ in [(9, 2)] },
            sample: { g in
                StoreStateTransformer().encode(StoreStateRecord(generation: g.next(), containerId: g.bytes(Int.random(in: 0...64, using: &g))))
            },
            decode: { bytes throws(DecodeError) in
                let t = StoreStateTransformer()
                return (t.encode(try t.decode(bytes)), bytes.count)
            }),
        Target(
            name: "chunk", lengthFields: { _ in [] },
            sample: { g in
                g.bytes(Int.random(in: 0...512, using: &g))
            },
            decode: { bytes throws(DecodeError) in
                let t = ChunkTransformer()
                return (t.encode(try t.decode(bytes)), bytes.count)
            }),
        Target(
            name: "path", lengthFields: { _ in [(1, 2)] },
            sample: { g in
                var w = ByteWriter()
                ContainerPathTransformer.encode(randomPath(&g), into: &w)
                return w.bytes
            },
            decode: { bytes throws(DecodeError) in
                var r = ByteReader(bytes)
                let v = try ContainerPathTransformer.decode(from: &r)
                // Whatever decodes must resolve, and never outside its root.
                let root = b("/r/oot")
                guard let resolved = try? ContainerPathTransformer.resolve(v, root: root) else {
                    throw DecodeError.invalidValue("FUZZ: decoded path does not resolve")
                }
                if case .relative = v {
                    let parts = resolved.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
                    guard resolved.starts(with: root), !parts.contains(where: { $0.elementsEqual(b("..")) }) else {
                        throw DecodeError.invalidValue("FUZZ: decoded relative path escapes its root")
                    }
                }
                var w = ByteWriter()
                ContainerPathTransformer.encode(v, into: &w)
                return (w.bytes, bytes.count - r.remaining)
            })
    ]

    static func mutate(_ input: [UInt8], target: Target, _ g: inout SplitMix64) -> [UInt8] {
        var s = input
        switch Int.random(in: 0...8, using: &g) {
        case 0:  // bit flips
            guard !s.isEmpty else { return s }
            for _ in 0..<Int.random(in: 1...3, using: &g) {
                s[Int.random(in: 0..<s.count, using: &g)] ^= UInt8(1) << UInt8.random(in: 0...7, using: &g)
            }
        case 1:  // truncation
            s = Array(s.prefix(Int.random(in: 0...s.count, using: &g)))
        case 2:  // insertion
            let at = Int.random(in: 0...s.count, using: &g)
            s.insert(contentsOf: g.bytes(Int.random(in: 1...8, using: &g)), at: at)
        case 3:  // deletion
            guard !s.isEmpty else { return s }
            let at = Int.random(in: 0..<s.count, using: &g)
            s.removeSubrange(at..<min(s.count, at + Int.random(in: 1...8, using: &g)))
        case 4:  // known length field inflated to something huge (or off by one)
            let fields = target.lengthFields(s).filter { $0.offset + $0.width <= s.count }
            guard let f = fields.randomElement(using: &g) else { return s }
            let choices: [UInt64] = [0xFFFF_FFFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF, 0x1001, 0x1000]
            var value = choices.randomElement(using: &g)!
            if Bool.random(using: &g) {  // or just one more or fewer than the truth
                var cur: UInt64 = 0
                for i in 0..<f.width { cur = cur << 8 | UInt64(s[f.offset + i]) }
                value = Bool.random(using: &g) ? cur &+ 1 : cur &- 1
            }
            for i in 0..<f.width { s[f.offset + i] = UInt8(truncatingIfNeeded: value >> (8 * UInt64(f.width - 1 - i))) }
        case 5:  // overwrite a random window with 0xFF (inflates whatever length field is there)
            guard s.count >= 2 else { return s }
            let width = min(s.count, Bool.random(using: &g) ? 2 : 4)
            let at = Int.random(in: 0...s.count - width, using: &g)
            for i in at..<at + width { s[i] = 0xFF }
        case 6:  // append
            s += g.bytes(Int.random(in: 1...16, using: &g))
        case 7:  // pure random bytes
            s = g.bytes(Int.random(in: 0...300, using: &g))
        default:  // splice two valid values
            s += target.sample(&g)
        }
        return s
    }

    @Test(arguments: targets.map(\.name))
    func fuzzDecoder(_ name: String) throws {
        let target = try required(Self.targets.first(where: { $0.name == name }))
        let seeds: [UInt64] = [0xC0FFEE, 0x5EED_0001, 42, 0xDEAD_BEEF_CAFE_F00D]
        let clock = ContinuousClock()
        let start = clock.now
        var accepted = 0, rejected = 0, failures = 0
        var slowest: Duration = .zero
        for seed in seeds {
            var g = SplitMix64(seed: seed &+ UInt64(name.utf8.reduce(0) { $0 &* 31 &+ Int($1) } & 0xFFFF))
            // A pool of valid encodings to mutate (fresh samples are costly in a debug build).
            let pool = (0..<200).map { _ in target.sample(&g) }
            let perSeed = Self.iterations / seeds.count
            var batchStart = clock.now
            for i in 0..<perSeed {
                let valid = pool[Int(g.next() % UInt64(pool.count))]
                // Every tenth input is a valid sample itself: it must round-trip.
                let input = i % 10 == 0 ? valid : Self.mutate(valid, target: target, &g)
                do {
                    let (reencoded, consumed) = try target.decode(input)
                    accepted += 1
                    if reencoded != Array(input.prefix(consumed)) {
                        failures += 1
                        if failures <= 5 {
                            Issue.record("\(name): seed \(seed) iteration \(i): decoded value re-encodes differently; input \(input.prefix(64))")
                        }
                    }
                } catch {
                    rejected += 1
                    if i % 10 == 0 || "\(error)".hasPrefix("invalid value: FUZZ") {
                        failures += 1
                        if failures <= 5 {
                            Issue.record(
                                "\(name): seed \(seed) iteration \(i): \(i % 10 == 0 ? "valid sample refused" : "property broken"): \(error)")
                        }
                    }
                }
                if i % 500 == 499 {
                    slowest = max(slowest, clock.now - batchStart)
                    batchStart = clock.now
                }
            }
        }
        #expect(slowest < .seconds(5), "\(name): 500 decodes took \(slowest)")
        let elapsed = clock.now - start
        #expect(accepted + rejected == Self.iterations)
        #expect(failures == 0)
        if name == "chunk" {
            #expect(rejected == 0, "a chunk's plaintext is any bytes up to the chunk limit")
        } else {
            #expect(rejected > Self.iterations / 4, "\(name): the mutations should mostly be refused (\(rejected) refused)")
        }
        #expect(accepted >= Self.iterations / 10, "\(name): the valid samples must decode (\(accepted) decoded)")
        #expect(elapsed < .seconds(30), "\(name): \(Self.iterations) decodes took \(elapsed)")
    }

    @Test func hugeLengthsOnTinyInputs() {
        // Every combination of a valid version byte followed by all-0xFF: never an allocation of the claimed size.
        for len in 0...128 {
            let bytes = [UInt8(1)] + [UInt8](repeating: 0xFF, count: len)
            _ = decodeError { try InodeTransformer().decode(bytes) }
            _ = decodeError { try DirectoryEntryTransformer().decode(bytes) }
            _ = decodeError { try ExtendedAttributeTransformer().decode(bytes) }
            _ = decodeError { try StoreStateTransformer().decode(bytes) }
            var r = ByteReader(bytes)
            _ = decodeError { try ContainerPathTransformer.decode(from: &r) }
            expectSomeError(DecodeError.self) { try DirectoryEntryTransformer().decode(bytes) }
            expectSomeError(DecodeError.self) { try ExtendedAttributeTransformer().decode(bytes) }
        }
    }
}
