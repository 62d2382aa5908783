import CPostgres
import Foundation

/// How a libpq connection string (URI or key=value, every libpq parameter) is handled here: passed to
/// libpq as it is, never logged, and every password it carries is cut out of the messages libpq
/// makes from it (libpq quotes tokens of a malformed string back, e.g. a bad percent-escape in the
/// URI's password).
enum PGConnectionString {
    /// Defaults applied only where the string does not set the parameter itself (libpq lets later
    /// keywords override earlier ones, and the expanded string comes last).
    static let defaults: [(String, String)] = [
        ("connect_timeout", "10"),  // a blackholed host must not hang a worker for minutes
        // Nor a connection that goes silent mid-statement (TCP only; the kernel default is ~15 min).
        ("keepalives", "1"), ("keepalives_idle", "5"), ("keepalives_interval", "2"), ("keepalives_count", "3"),
        ("tcp_user_timeout", "15000"),
        ("application_name", "coffer")  // what pg_stat_activity shows
    ]

    /// The passwords `conninfo` carries, as written and percent-decoded, longest first.
    static func secrets(in conninfo: String) -> [String] {
        var found: [String] = []
        // What libpq itself parses out (works for every well-formed string).
        var err: UnsafeMutablePointer<CChar>?
        if let options = PQconninfoParse(conninfo, &err) {
            var o = options
            while let keyword = o.pointee.keyword {
                if String(cString: keyword) == "password", let v = o.pointee.val { found.append(String(cString: v)) }
                o += 1
            }
            PQconninfoFree(options)
        }
        if let err { PQfreemem(err) }
        // And what a malformed string may hold: userinfo of a URI, `password=` in either syntax.
        if let uri = conninfo.firstMatch(of: /^postgres(?:ql)?:\/\/([^@\/?]*)@/),
            let colon = uri.1.firstIndex(of: ":")
        {
            found.append(String(uri.1[uri.1.index(after: colon)...]))
        }
        for m in conninfo.matches(of: /[?&]password=([^&]*)/) { found.append(String(m.1)) }
        for m in conninfo.matches(of: /password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)/) {
            let v = String(m.1)
            found.append(v)
            if v.hasPrefix("'") { found.append(String(v.dropFirst().dropLast(v.count > 1 && v.hasSuffix("'") ? 1 : 0))) }
        }
        var all = Set<String>()
        for s in found where !s.isEmpty {
            all.insert(s)
            if let d = s.removingPercentEncoding, !d.isEmpty { all.insert(d) }
        }
        return all.sorted { $0.count > $1.count }
    }

    /// `message` with every secret replaced by "***".
    static func redact(_ message: String, secrets: [String]) -> String {
        var m = message
        for s in secrets where m.contains(s) { m = m.replacingOccurrences(of: s, with: "***") }
        return m
    }
}
