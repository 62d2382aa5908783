import CofferStore
import Foundation
import Glibc

/// One container's mount described in a file (`~/.config/coffer/NAME.conf`), read by
/// `coffer mount --config FILE` and so by the `coffer@NAME` user service.
///
/// Plain `key = value` lines; `#` or `;` starts a comment line. Relative paths are resolved against
/// the file's own directory (so a conf can sit next to its container and move with it), `~/` against
/// $HOME. The password itself never goes in here: only where to get it.
struct ServiceConfig: Equatable {
    var container: String
    var mountpoint: String
    var passfile: String?
    var keyfile: String?
    var extpass: String?
    /// A passfile in $CREDENTIALS_DIRECTORY (systemd's LoadCredential= / LoadCredentialEncrypted=).
    var credential: String?
    var options: String?

    static let keys = ["container", "mountpoint", "passfile", "keyfile", "extpass", "credential", "options"]

    static func fail(_ message: String) -> CLIFailure { CLIFailure(message: message, code: 64) }

    static func load(_ path: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> ServiceConfig {
        let absolute = Container.absolutePath(path)
        guard let data = FileManager.default.contents(atPath: absolute) else {
            throw CLIFailure(message: "cannot read config file \(absolute): \(String(cString: strerror(errno)))", code: ExitStatus.failure)
        }
        guard let text = String(data: data, encoding: .utf8) else { throw fail("config file \(absolute) is not UTF-8 text") }
        return try parse(text, file: absolute, environment: environment)
    }

    static func parse(_ text: String, file: String, environment: [String: String]) throws -> ServiceConfig {
        var values: [String: (value: String, line: Int)] = [:]
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = index + 1
            let trimmed = raw.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty || trimmed.hasPrefix("#") || trimmed.hasPrefix(";") { continue }
            guard let eq = trimmed.firstIndex(of: "=") else {
                throw fail("\(file):\(line): expected `key = value`")
            }
            let key = trimmed[..<eq].trimmingCharacters(in: .whitespaces).lowercased()
            let value = trimmed[trimmed.index(after: eq)...].trimmingCharacters(in: .whitespaces)
            if key == "password" || key == "pass" || key == "passphrase" {
                throw fail(
                    "\(file):\(line): a password never goes in the config file; use passfile = FILE (readable only by you), keyfile = FILE, credential = NAME (systemd LoadCredential=) or extpass = CMD"
                )
            }
            guard keys.contains(key) else {
                throw fail("\(file):\(line): unknown key \"\(key)\" (known: \(keys.joined(separator: ", ")))")
            }
            if let earlier = values[key] { throw fail("\(file):\(line): \"\(key)\" is already set on line \(earlier.line)") }
            guard !value.isEmpty else { throw fail("\(file):\(line): \"\(key)\" has no value") }
            values[key] = (value, line)
        }
        let dir = (file as NSString).deletingLastPathComponent
        let home = environment["HOME"]
        func path(_ key: String) throws -> String? {
            guard let v = values[key] else { return nil }
            return try resolve(v.value, against: dir, home: home, where: "\(file):\(v.line)")
        }
        // A postgresql:// URI is taken as written (the database password stays in libpq's sources), but for the
        // files its parameters name: relative ones are relative to this file, as every path here.
        let uri = values["container"].map(\.value).flatMap { ContainerURI.isURI($0) ? PostgresLocation.withFiles(of: $0, relativeTo: dir) : nil }
        guard let container = try uri ?? path("container") else { throw fail("\(file): no \"container\" given") }
        guard let mountpoint = try path("mountpoint") else { throw fail("\(file): no \"mountpoint\" given") }
        var config = ServiceConfig(
            container: container, mountpoint: mountpoint, passfile: try path("passfile"),
            keyfile: try path("keyfile"), extpass: values["extpass"]?.value,
            credential: values["credential"]?.value, options: values["options"]?.value)
        let sources = ["passfile", "keyfile", "extpass", "credential"].filter { values[$0] != nil }
        if sources.count > 1 { throw fail("\(file): give only one password source (found \(sources.joined(separator: ", ")))") }
        if let name = config.credential {
            guard !name.contains("/"), name != ".", name != ".." else { throw fail("\(file): credential \"\(name)\" must be a plain name") }
            guard let dir = environment["CREDENTIALS_DIRECTORY"], !dir.isEmpty else {
                throw CLIFailure(
                    message:
                        "credential \"\(name)\": $CREDENTIALS_DIRECTORY is not set (run as a service with LoadCredential=\(name):FILE or LoadCredentialEncrypted=\(name):FILE)",
                    code: ExitStatus.badPasswordInput)
            }
            config.passfile = dir + "/" + name
        }
        return config
    }

    /// The `mountpoint` of a config's text, resolved as text only (`~/` against `home`, a relative one against
    /// the directory of `file`, which is absolute): `coffer unmount` matches a --config daemon with it, where
    /// looking a path up could hang on another daemon's mount. Nil when there is none.
    static func mountpointText(_ text: String, file: String, home: String?) -> String? {
        for raw in text.split(separator: "\n") {
            let line = raw.trimmingCharacters(in: .whitespaces)
            guard !line.hasPrefix("#"), !line.hasPrefix(";"), let eq = line.firstIndex(of: "="),
                line[..<eq].trimmingCharacters(in: .whitespaces).lowercased() == "mountpoint"
            else { continue }
            let value = line[line.index(after: eq)...].trimmingCharacters(in: .whitespaces)
            if value == "~" || value.hasPrefix("~/") {
                guard let home, !home.isEmpty else { return nil }
                return home + value.dropFirst()
            }
            return value.hasPrefix("/") ? value : (file as NSString).deletingLastPathComponent + "/" + value
        }
        return nil
    }

    /// `~/x` is under $HOME; any other relative path is under the config file's directory.
    static func resolve(_ value: String, against dir: String, home: String?, where place: String) throws -> String {
        var p = value
        if p == "~" || p.hasPrefix("~/") {
            guard let home, !home.isEmpty else { throw fail("\(place): \(value) needs $HOME") }
            p = home + p.dropFirst()
        } else if !p.hasPrefix("/") {
            p = dir + "/" + p
        }
        return (p as NSString).standardizingPath
    }
}
