/// Everything that can go wrong opening or changing a container, each with one clear line.
/// No case ever carries key material or a password.
public enum ContainerError: Error, Equatable, CustomStringConvertible {
    case notFound(String)
    case notADirectory(String)
    case unreadable(String, String)
    /// A container in PostgreSQL whose server cannot be reached (down, unreachable, not taking connections):
    /// not a missing container, and worth trying again. A login the server refuses is `.unreadable`.
    case unreachable(String, String)
    case notAContainer(String)
    /// A `postgresql://` URI that does not name a container (a bad or repeated `container=`): a usage error.
    case badURI(String)
    /// A store without its header: what an interrupted `coffer copy` leaves until it is run again (a directory
    /// whose coffer.json was lost looks the same), not a damaged container.
    case unfinishedCopy(String, orLostHeader: Bool)
    case alreadyExists(String)
    case headerDamaged(String)
    case headerTampered
    case unsupportedVersion(Int)
    case unsupportedCipher(String)
    case unsupportedFeature(String)
    case weakKDF(String)
    /// Parameters beyond what Coffer runs (a header asking for terabytes of memory), or not parameters at all.
    case kdfOutOfRange(String)
    case wrongSecret
    case noMatchingSlot
    case slotNotFound(String)
    case lastSlot
    /// The stored header is no longer the one read (another process rewrote it meanwhile).
    case headerChanged
    case io(String)
    case crypto(String)

    public var description: String {
        switch self {
        case .notFound(let p): return "\(p): no such container directory"
        case .notADirectory(let p): return "\(p): not a directory"
        case .unreadable(let p, let why): return "\(p): cannot read the container: \(why)"
        case .unreachable(let p, let why): return "\(p): cannot connect to the server: \(why)"
        case .notAContainer(let p): return "\(p): not a Coffer container (no readable \(ContainerHeader.fileName))"
        case .badURI(let why): return "the container URI: \(why)"
        case .unfinishedCopy(let p, let orLost):
            return "\(p): an unfinished coffer copy (its store has no header yet): run the same coffer copy again to finish it"
                + (orLost ? "; or a container whose \(ContainerHeader.fileName) was lost: put it back from a backup" : "")
        case .alreadyExists(let p): return "\(p): already exists and is not empty"
        case .headerDamaged(let why): return "container header is damaged: \(why)"
        case .headerTampered: return "container header failed authentication: it was edited or damaged (refusing to open)"
        case .unsupportedVersion(let v): return "container format version \(v) is not supported by this coffer"
        case .unsupportedCipher(let c): return "container cipher \"\(c)\" is not supported (refusing to open)"
        case .unsupportedFeature(let f): return "container uses unknown feature \"\(f)\" (refusing to open)"
        case .weakKDF(let k): return "key derivation \(k) is weaker than the minimum (scrypt N=2^16 r=8 p=1 / argon2id t=2 m=64 MiB); refusing"
        case .kdfOutOfRange(let k):
            return
                "key derivation \(k) is outside what Coffer runs (argon2id t 2-64, m 64 MiB-4 GiB, p 1-16; scrypt N 2^16-2^24, r 8-64, p 1-16); refusing"
        case .wrongSecret: return "wrong password or key: no key slot opens with it"
        case .noMatchingSlot: return "the container has no key slot of this kind"
        case .slotNotFound(let id): return "no key slot \(id)"
        case .lastSlot: return "refusing to remove the last key slot: the container would be lost"
        case .headerChanged:
            return
                "the container's header changed since this command read it (another coffer passwd at the same time?): nothing was written; run the command again"
        case .io(let why): return why
        case .crypto(let why): return "crypto failure: \(why)"
        }
    }
}
