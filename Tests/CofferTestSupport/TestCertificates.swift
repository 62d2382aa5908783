import Foundation

/// A throwaway certificate authority, a server certificate it signed for some host names, and a second
/// authority that signed nothing, made with the `openssl` command (Debian's openssl; `make test` installs
/// it), for a test cluster that speaks TLS (`PostgresCluster(settings: certificates.serverSettings)`).
/// The files are the `postgres` user's when run as root, so the server may read its key.
public final class TestCertificates: @unchecked Sendable {
    public let directory: String
    /// The authority that signed the server's certificate: `sslrootcert=` for a connection that verifies.
    public var authority: String { directory + "/ca.crt" }
    /// An authority that signed nothing of the server's: `sslrootcert=` for a connection that must fail.
    public var otherAuthority: String { directory + "/other-ca.crt" }
    public var serverCertificate: String { directory + "/server.crt" }
    public var serverKey: String { directory + "/server.key" }

    /// `ssl = on` with this server certificate and key, for `PostgresCluster(settings:)`.
    public var serverSettings: [String] {
        ["ssl = on", "ssl_cert_file = '\(serverCertificate)'", "ssl_key_file = '\(serverKey)'"]
    }

    /// `hostNames`: the server certificate's DNS names (subjectAltName); a host not among them fails
    /// `sslmode=verify-full`.
    public init(hostNames: [String]) throws {
        var template = Array("/tmp/coffer-tls-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw TestFailure("mkdtemp failed: \(String(cString: strerror(errno)))") }
        directory = String(cString: dir)
        do {
            let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            for (name, cn) in [("ca", "Coffer test CA"), ("other-ca", "Another test CA")] {
                try openssl(["req", "-x509"] + ec + ["-days", "2", "-subj", "/CN=\(cn)", "-keyout", "\(name).key", "-out", "\(name).crt"])
            }
            try openssl(["req"] + ec + ["-subj", "/CN=\(hostNames.first ?? "localhost")", "-keyout", "server.key", "-out", "server.csr"])
            let san = directory + "/san.ext"
            try ("subjectAltName = " + hostNames.map { "DNS:\($0)" }.joined(separator: ",") + "\n")
                .write(toFile: san, atomically: true, encoding: .utf8)
            try openssl([
                "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", san, "-out", "server.crt"
            ])
            chmod(serverKey, 0o600)  // the server refuses a key others may read
            if getuid() == 0 {
                _ = try PostgresCluster.run("/bin/chown", ["-R", "postgres:postgres", directory])
                chmod(directory, 0o755)  // the tests (root) read the authorities; the key stays 0600
            }
        } catch {
            remove()
            throw error
        }
    }

    deinit { remove() }

    public func remove() { try? FileManager.default.removeItem(atPath: directory) }

    private func openssl(_ arguments: [String]) throws {
        _ = try PostgresCluster.run("/bin/sh", ["-c", "cd \"$0\" && exec openssl \"$@\"", directory] + arguments)
    }
}
