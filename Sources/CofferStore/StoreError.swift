/// Failures of the entity store. Authentication failures name the entity, never its contents.
public enum StoreError: Error, Equatable, CustomStringConvertible {
    /// A sealed value did not authenticate under its kind and id: tampering or damage.
    case authenticationFailed(kind: EntityKind, entity: String)
    /// A value authenticated but its plaintext is not a valid value of its kind.
    case malformed(kind: EntityKind, entity: String, DecodeError)
    case unknownKind(String)
    case unknownTransformer(kind: String, transformer: String)
    case missingKind(String)
    case notAStore(String)
    /// SQLite finds the store file damaged where it must read to open it (truncated, pages overwritten).
    case damagedFile(String)
    /// The store file's schema has objects Coffer never makes (StoreFileCheck.swift), named here.
    case foreignObjects(String)
    case wrongContainer
    case database(String)
    /// Sealing or deriving a key failed (the crypto library refused): nothing was written.
    case sealingFailed(String)
    /// The random generator failed: no id, nonce or version could be drawn.
    case randomFailed
    /// The engine's server cannot be reached (PostgreSQL: connection lost, not back within the wait).
    case unavailable(String)
    /// Another mount took over the container's lease (PostgreSQL): this one commits nothing more.
    case leaseLost
    /// The store went back below a generation this machine saw durable while mounted (a hostile or
    /// restored server): nothing is written over it.
    case rolledBack(seen: UInt64, served: UInt64)
    case diskFull
    case readOnly

    public var description: String {
        switch self {
        // Entity descriptions start with their kind ("chunk 3 of content …", "inode …").
        case let .authenticationFailed(_, entity): return "\(entity) failed authentication (tampered or damaged)"
        case let .malformed(_, entity, why): return "\(entity) is malformed: \(why)"
        case .unknownKind(let k): return "store names unknown entity kind \"\(k)\" (refusing to open)"
        case let .unknownTransformer(kind, t):
            return "store names transformer \"\(t)\" for \(kind), which this coffer does not have (refusing to open)"
        case .missingKind(let k): return "store does not declare entity kind \"\(k)\" (refusing to open)"
        case .notAStore(let why): return "not a Coffer entity store: \(why)"
        case .damagedFile(let why):
            return "the store file is damaged (\(why)): nothing in place can mend it; restore a backup (coffer copy)"
        case .foreignObjects(let names):
            return "the store file holds \(names), which Coffer never makes (edited or hostile): `coffer fsck --repair` removes it (refusing to open)"
        case .wrongContainer: return "the entity store belongs to another container (refusing to open)"
        case .database(let why): return "store database error: \(why)"
        case .sealingFailed(let why): return "sealing failed: \(why)"
        case .randomFailed: return "the random generator failed"
        case .unavailable(let why): return "the store's server cannot be reached: \(why)"
        case .leaseLost: return "this mount's lease on the container lapsed and the container was taken: nothing more is written from here"
        case let .rolledBack(seen, served):
            return
                "the store went back to generation \(served) below generation \(seen), which this machine saw durable (a rollback): nothing is written over it"
        case .diskFull: return "no space left on the container's disk"
        case .readOnly: return "the store is open read-only"
        }
    }
}
