import Foundation

/// Where a container lives: a directory (header file and SQLite store) or a schema in a PostgreSQL
/// database (header row and tables; docs/FORMAT.md "Containers in PostgreSQL"). Parsed once from
/// what the user typed, so every command accepts either form.
public enum ContainerLocation: Sendable, Equatable, CustomStringConvertible {
    case directory(String)
    case postgres(PostgresLocation)

    /// A `postgresql://` or `postgres://` URI names a PostgreSQL container; anything else is a path.
    public static func parse(_ text: String) throws(ContainerError) -> ContainerLocation {
        guard PostgresLocation.isURI(text) else { return .directory(text) }
        return .postgres(try PostgresLocation(uri: text))
    }

    /// For messages: the path, or the URI without password and libpq parameters.
    public var description: String {
        switch self {
        case .directory(let path): return path
        case .postgres(let p): return p.display
        }
    }
}

/// A PostgreSQL container: the libpq connection string (every parameter the user gave except
/// `container`) and the schema that holds the container.
public struct PostgresLocation: Sendable, Equatable {
    public static let defaultContainer = "coffer"
    /// What libpq gets: the URI without `container=` (passwords stay in it; never shown).
    public let conninfo: String
    /// The schema name (validated: `PostgresIdentifier`).
    public let container: String
    /// `scheme://[user@]host[:port]/dbname?container=NAME`: no password, no other parameters.
    public let display: String

    /// Whether the URI itself carries a password (userinfo or `password=`): the CLI refuses it, so a
    /// password never reaches argv or a daemon's command line (libpq's other sources remain).
    public var carriesPassword: Bool { !PGConnectionString.secrets(in: conninfo).isEmpty }

    static func isURI(_ text: String) -> Bool { text.hasPrefix("postgresql://") || text.hasPrefix("postgres://") }

    public init(uri: String) throws(ContainerError) {
        guard Self.isURI(uri) else { throw .notAContainer("not a postgresql:// URI") }
        let parts = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let base = String(parts[0])
        var kept: [Substring] = [], names: [String] = []
        for p in parts.count > 1 ? parts[1].split(separator: "&") : [] {
            if p.hasPrefix("container=") {
                guard let name = String(p.dropFirst("container=".count)).removingPercentEncoding else {
                    throw .badURI("the container name is not valid percent-encoding")
                }
                names.append(name)
            } else {
                kept.append(Self.withAbsoluteFile(p))
            }
        }
        guard names.count <= 1 else { throw .badURI("it names more than one container") }
        let name = names.first ?? Self.defaultContainer
        guard PostgresIdentifier.isValid(name) else {
            throw .badURI("container name \"\(name)\": use 1-63 letters, digits and _, not starting with a digit or pg_")
        }
        container = name
        conninfo = kept.isEmpty ? base : base + "?" + kept.joined(separator: "&")
        display = Self.withoutPassword(base) + "?container=" + name
    }

    /// libpq's parameters that name files, which it opens at every connection (a mount's reconnects too).
    static let fileParameters: Set<Substring> = ["passfile", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir"]

    /// `uri` with the relative files its parameters name made absolute against `directory` (a config file's
    /// relative paths are relative to the config file, those inside its URI too).
    public static func withFiles(of uri: String, relativeTo directory: String) -> String {
        let parts = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else { return uri }
        return parts[0] + "?"
            + parts[1].split(separator: "&", omittingEmptySubsequences: false).map { withAbsoluteFile($0, against: directory) }
            .joined(separator: "&")
    }

    /// `key=value` with a relative file `value` made absolute against `directory` (default: the working
    /// directory now): the mount daemon leaves its working directory once it serves (so it does not keep
    /// the user's directory, and its filesystem, busy), and libpq reads these files again whenever it reconnects.
    static func withAbsoluteFile(_ parameter: Substring, against directory: String? = nil) -> Substring {
        let pair = parameter.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        guard pair.count == 2, fileParameters.contains(pair[0]), let value = String(pair[1]).removingPercentEncoding,
            let absolute = absoluteFile(String(pair[0]), value, against: directory)
        else { return parameter }
        guard let encoded = absolute.addingPercentEncoding(withAllowedCharacters: unreserved) else { return parameter }
        return pair[0] + "=" + encoded
    }

    /// What a rewritten path keeps as it is in a URI: RFC 3986's unreserved characters and "/".
    private static let unreserved = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/")

    /// `value` of libpq's file parameter `key` joined to `directory` (default: the working directory) when it is
    /// a relative path; nil when it is absolute, empty, or not a path (`sslrootcert=system`, the system's
    /// authorities; an `sslkey` of an OpenSSL engine, `engine:key`). Joined as text: a link on the way is
    /// followed by libpq at each connection, as the user wrote it (a renewed certificate behind `live/`).
    public static func absoluteFile(_ key: String, _ value: String, against directory: String? = nil) -> String? {
        guard !value.isEmpty, !value.hasPrefix("/"), !(key == "sslrootcert" && value == "system"), !(key == "sslkey" && value.contains(":"))
        else { return nil }
        return (directory ?? FileManager.default.currentDirectoryPath) + "/" + value
    }

    /// The URI's base with the password of its userinfo cut out.
    private static func withoutPassword(_ base: String) -> String {
        guard let scheme = base.range(of: "://") else { return base }
        let rest = base[scheme.upperBound...]
        let authorityEnd = rest.firstIndex(of: "/") ?? rest.endIndex
        guard let at = rest[..<authorityEnd].lastIndex(of: "@") else { return base }
        let userinfo = rest[..<at]
        let user = userinfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)[0]
        return String(base[..<scheme.upperBound]) + user + rest[at...]
    }
}

/// Schema names: checked against a conservative set and always double-quoted in SQL, so a name is
/// never SQL and never folds case.
enum PostgresIdentifier {
    static func isValid(_ name: String) -> Bool {
        guard (1...63).contains(name.utf8.count), !name.lowercased().hasPrefix("pg_"),
            let first = name.unicodeScalars.first, !("0"..."9").contains(first)
        else { return false }
        return name.unicodeScalars.allSatisfy { $0 == "_" || ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) }
    }

    /// `"name"` (valid names hold no quote, so no escaping is needed).
    static func quoted(_ name: String) -> String { "\"" + name + "\"" }
}
