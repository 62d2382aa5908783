import ArgumentParser
import CofferStore
import Foundation

struct InfoCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "info",
        abstract:
            "Show a container's format, cipher, key derivation and key slots; with a secret, also its contents' counts and how its chunks are sealed."
    )

    @Argument(help: "The container directory or postgresql:// URI.")
    var container: String

    @OptionGroup var secret: SecretOptions

    @Flag(help: "Ask for the password (on a terminal) to show entity counts, store size and chunk sealing.")
    var unlock = false

    func run() throws {
        try reportingFailures {
            let c = try ContainerSource.open(container)
            // The secret first: a source that fails must fail before the header is printed.
            let given = unlock || secret.isGiven ? try secret.secret() : nil
            defer { given?.bytes.wipe() }
            let h = c.header
            print("Container:      \(c.root)")
            print("Format:         \(h.format) version \(h.version)")
            print("Container id:   \(h.containerId)")
            print("Cipher:         \(h.cipher), \(h.chunkSize / 1024) KiB chunks")
            if case .postgres(let p) = c.location {
                print("Store:          PostgreSQL schema \"\(p.container)\"")
            } else {
                print("Store:          \(h.store)")
            }
            print("Features:       \(h.features.isEmpty ? "none" : h.features.joined(separator: ", "))")
            print("Key slots:      \(h.slots.count)")
            for slot in h.slots {
                print(
                    "  \(slot.id)  \(slot.kind.rawValue.padding(toLength: 9, withPad: " ", startingAt: 0)) \(describe(slot.kdf))\(slot.label.map { "  \"\($0)\"" } ?? "")"
                )
            }
            guard let given else { return }
            let (keys, slotId) = try c.unlock(given)
            defer { keys.wipe() }
            print("Unlocked by:    slot \(slotId)")
            switch c.location {
            case .directory:
                // The daemon holds the store for itself (EntityStore.exclusiveByDefault): it is asked.
                if let pid = ContainerLock.holder(root: c.root) {
                    print("Mounted:        by daemon pid \(pid > 0 ? String(pid) : "?")")
                    guard pid > 0, let status = try DaemonStatus.ask(containerId: h.containerId, daemon: pid) else {
                        print(
                            "                (no control socket of that daemon found for this user: unmount it to see entity counts and store size)")
                        return
                    }
                    printState(
                        generation: status.generation, counts: status.counts, size: SQLiteBackend.sizeOnDisk(path: try c.storePath()),
                        sealing: status.chunkSealing)
                    return
                }
            case .postgres:
                // Read beside its mounts, as another mount would.
                if let holder = ContainerClaim.holder(c) { print("Mounted:        by daemon \(holder)") }
            }
            let store = try c.openStore(keys: keys, readOnly: true)
            defer { store.close() }
            printState(generation: store.generation, counts: try store.counts(), size: store.sizeOnDisk, sealing: store.chunkSealing)
        }
    }

    func printState(generation: UInt64, counts: StoreCounts, size: UInt64, sealing: ChunkSealing?) {
        print("Generation:     \(generation)")
        // Stores made before 2026-11-28 seal chunks whole; a new container (and files copied into it) gets blocks.
        switch sealing {
        case .blocks: print("Chunk sealing:  in 4 KiB blocks (coffer.chunk.v2)")
        case .whole: print("Chunk sealing:  whole chunks (coffer.chunk.v1, made before 2026-11-28)")
        case nil: break
        }
        print(
            "Entities:       \(counts.inodes) inodes, \(counts.entries) directory entries, \(counts.chunks) content chunks, \(counts.xattrs) xattrs"
        )
        print("Store size:     \(size) bytes")
    }

    func describe(_ k: KDFParameters) -> String {
        switch k.algorithm {
        case "argon2id": return "argon2id t=\(k.iterations ?? 0) m=\((k.memoryKiB ?? 0) / 1024) MiB p=\(k.parallelism ?? 0)"
        case "scrypt": return "scrypt N=2^\(k.logN ?? 0) r=\(k.r ?? 0) p=\(k.p ?? 0)"
        case "hkdf": return "hkdf-sha256 (256-bit random key)"
        default: return k.algorithm
        }
    }
}
