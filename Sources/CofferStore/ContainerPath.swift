/// The container-relative path transformer.
///
/// A path that points inside a root (the container directory, or the mountpoint for symlink
/// targets) is stored relative to that root and resolved against the root of the day when read,
/// so a container can move, sync elsewhere or be mounted at another place. Other paths are
/// stored exactly as given. Stored relative paths that would escape their root are refused.
public enum StoredPath: Equatable, Sendable {
    /// Relative to the root; empty means the root itself.
    case relative([UInt8])
    /// Stored as given (outside the root, relative to the link's directory, or not clean).
    case verbatim([UInt8])
}

public enum PathError: Error, Equatable, CustomStringConvertible {
    case containsNul
    case escapesRoot
    case absoluteInjection
    case tooLong(Int)
    public var description: String {
        switch self {
        case .containsNul: return "stored path contains a NUL byte"
        case .escapesRoot: return "stored path would resolve outside its root (`..`)"
        case .absoluteInjection: return "stored relative path is absolute"
        case .tooLong(let n): return "stored path is \(n) bytes, limit \(ContainerPathTransformer.maxLength)"
        }
    }
}

public enum ContainerPathTransformer {
    public static let maxLength = 4096
    public static let name = "coffer.path.v1"
    private static let slash = UInt8(ascii: "/")
    private static let dot = UInt8(ascii: ".")

    /// Decides how `path` is stored. Only clean absolute paths (no `.`/`..` components, no empty
    /// components) inside `root` become relative, so reading back gives the same bytes when the
    /// root has not moved.
    public static func store(_ path: [UInt8], root: [UInt8]) -> StoredPath {
        let root = trimTrailingSlashes(root)
        guard path.first == slash, !path.contains(0), !root.isEmpty, root.first == slash else { return .verbatim(path) }
        guard isClean(path) else { return .verbatim(path) }
        if path == root { return .relative([]) }
        guard path.count > root.count + 1, path.starts(with: root), path[root.count] == slash else { return .verbatim(path) }
        return .relative(Array(path[(root.count + 1)...]))
    }

    /// Resolves a stored path against today's root, refusing values that would escape it.
    public static func resolve(_ stored: StoredPath, root: [UInt8]) throws(PathError) -> [UInt8] {
        switch stored {
        case .verbatim(let p):
            try validate(p)
            return p
        case .relative(let rel):
            try validateRelative(rel)
            let r = trimTrailingSlashes(root)
            if rel.isEmpty { return r }
            return r == [slash] ? r + rel : r + [slash] + rel
        }
    }

    public static func encode(_ stored: StoredPath, into w: inout ByteWriter) {
        switch stored {
        case .relative(let p):
            w.u8(1)
            w.short(p)
        case .verbatim(let p):
            w.u8(0)
            w.short(p)
        }
    }

    /// Decoding validates too: a hostile store cannot smuggle an escaping path past `resolve`.
    public static func decode(from r: inout ByteReader) throws(DecodeError) -> StoredPath {
        let tag = try r.u8()
        let bytes = try r.short(field: "path", limit: maxLength)
        do {
            switch tag {
            case 0:
                try validate(bytes)
                return .verbatim(bytes)
            case 1:
                try validateRelative(bytes)
                return .relative(bytes)
            default: throw DecodeError.invalidValue("path tag \(tag)")
            }
        } catch let e as PathError {
            throw .invalidValue(e.description)
        } catch let e as DecodeError {
            throw e
        } catch {
            throw .invalidValue("path")
        }
    }

    /// Text form for the plain-text header (UTF-8 paths): relative paths as they are, verbatim
    /// (outside-root) paths are absolute by construction.
    public static func storeString(_ path: String, root: String) -> String {
        switch store(Array(path.utf8), root: Array(root.utf8)) {
        case .relative(let r): return String(decoding: r, as: UTF8.self)
        case .verbatim(let v): return String(decoding: v, as: UTF8.self)
        }
    }
    public static func resolveString(_ stored: String, root: String) throws(PathError) -> String {
        let bytes = Array(stored.utf8)
        let value: StoredPath = bytes.first == slash ? .verbatim(bytes) : .relative(bytes)
        return String(decoding: try resolve(value, root: Array(root.utf8)), as: UTF8.self)
    }

    static func validate(_ p: [UInt8]) throws(PathError) {
        if p.count > maxLength { throw .tooLong(p.count) }
        if p.contains(0) { throw .containsNul }
    }
    static func validateRelative(_ p: [UInt8]) throws(PathError) {
        try validate(p)
        if p.first == slash { throw .absoluteInjection }
        for component in p.split(separator: slash, omittingEmptySubsequences: false) {
            if component.elementsEqual([dot, dot]) { throw .escapesRoot }
        }
    }
    static func isClean(_ p: [UInt8]) -> Bool {
        let parts = p.dropFirst().split(separator: slash, omittingEmptySubsequences: false)
        for c in parts {
            if c.isEmpty || c.elementsEqual([dot]) || c.elementsEqual([dot, dot]) { return false }
        }
        return true
    }
    static func trimTrailingSlashes(_ p: [UInt8]) -> [UInt8] {
        var p = p
        while p.count > 1, p.last == slash { p.removeLast() }
        return p
    }
}
