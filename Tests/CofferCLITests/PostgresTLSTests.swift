import CofferTestSupport
import Foundation
import Testing

// A container in PostgreSQL over TLS, through the real binary (issue 16, item 1: `sslmode=verify-full` and
// `sslrootcert=` work as in psql): a cluster of its own that speaks TLS with a certificate for "localhost"
// from a throwaway authority, a role with a password from a passfile, every connection of the daemon
// encrypted, and a server the URI's TLS settings refuse reported as refused (status 10, which the user
// unit does not retry), not as a server that is away (19).

@Suite("PostgreSQL containers over TLS", .serialized)
struct PostgresTLSTests {
    /// The cluster, its certificates and a password role whose passfile is `pgpass` under the sandbox.
    private struct Server {
        let certificates: TestCertificates
        let cluster: PostgresCluster
        let role = "tls_user"
        let password = "tls-pw-\(UUID().uuidString.prefix(8))"

        init() throws {
            certificates = try TestCertificates(hostNames: ["localhost"])
            cluster = try PostgresCluster(settings: certificates.serverSettings)
            try cluster.psql("CREATE ROLE \(role) LOGIN PASSWORD '\(password)'; GRANT CONNECT, CREATE ON DATABASE \(cluster.database) TO \(role)")
        }

        /// A URI to schema `container` as the role, over TCP to `host` with `sslmode=verify-full` and `authority`.
        func uri(host: String = "localhost", authority: String? = nil, passfile: String, container: String = "tls") -> String {
            "postgresql://\(role)@\(host):\(cluster.port)/\(cluster.database)?sslmode=verify-full"
                + "&sslrootcert=\(authority ?? certificates.authority)&passfile=\(passfile)&container=\(container)"
        }

        func writePassfile(_ path: String) throws {
            try E2E.write(path, "*:\(cluster.port):\(cluster.database):\(role):\(password)\n")
            chmod(path, 0o600)
        }

        func stop() {
            cluster.destroy()
            certificates.remove()
        }
    }

    /// A TLS server and a sandbox whose `pgpass` holds the role's password, both gone when `body` returns.
    private func withServer(_ label: String, _ body: (Server, Sandbox, _ pgpass: String) throws -> Void) throws {
        let server = try Server()
        defer { server.stop() }
        let sb = try Sandbox(label)
        defer { sb.cleanup() }
        try server.writePassfile(sb.root + "/pgpass")
        try body(server, sb, sb.root + "/pgpass")
    }

    @Test func aContainerOverVerifiedTLS() throws {
        try withServer("pgtls") { server, sb, pgpass in
            let uri = server.uri(passfile: pgpass)
            let made = sb.initContainer(container: uri)
            try #require(made.ok, "\(made)\n\(server.cluster.log.suffix(2000))")
            let m = sb.mount(container: uri)
            try #require(m.ok, "\(m)")
            try E2E.write(sb.mnt + "/over-tls.txt", "sealed, then encrypted on the wire\n")
            #expect(E2E.sh("sync \(sb.mnt)/over-tls.txt").ok)
            // Every session of the role (the daemon's writer, readers, listener, lease and locks) is encrypted.
            let sessions = try server.cluster.psql(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = '\(server.role)'"
            ).trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "|").compactMap { Int($0) }
            #expect(sessions.count == 2 && sessions[0] >= 2 && sessions[1] == 0, "TLS sessions | sessions without TLS: \(sessions)")
            #expect(sb.unmount().ok)
            let again = sb.mount(container: uri)
            try #require(again.ok, "\(again)")
            #expect(E2E.readText(sb.mnt + "/over-tls.txt") == "sealed, then encrypted on the wire\n")
            #expect(sb.unmount().ok)
            let fsck = E2E.coffer(["fsck", uri, "--passfile", sb.passfile])
            #expect(fsck.ok && fsck.stdout.contains("0 problem(s)"), "\(fsck)")
        }
    }

    /// Files named relative to the directory `coffer mount` ran in (`sslrootcert=` in the URI, PGPASSFILE in
    /// the environment) are read again at every reconnect, after the daemon has left that directory: they
    /// still are the same files once the server restarted under the mount.
    @Test func relativeFilesOutliveTheDaemonsMoveAndAReconnect() throws {
        try withServer("pgtlsrel") { server, sb, _ in
            let authority = "../" + (server.certificates.authority.dropFirst("/tmp/".count))
            try #require(sb.root.hasPrefix("/tmp/") && server.certificates.authority.hasPrefix("/tmp/"))
            let uri =
                "postgresql://\(server.role)@localhost:\(server.cluster.port)/\(server.cluster.database)?sslmode=verify-full"
                + "&sslrootcert=\(authority)&container=tls_relative"
            let here = "cd '\(sb.root)' && PGPASSFILE=pgpass '\(E2E.coffer)'"
            let made = E2E.sh("\(here) init '\(uri)' --passfile pass \(Sandbox.kdfArgs.joined(separator: " "))")
            try #require(made.ok, "\(made)")
            let m = E2E.sh("\(here) mount '\(uri)' m --passfile pass")
            sb.noteDaemon(container: uri)
            try #require(m.ok, "\(m)")
            let pid = try #require(E2E.daemonPid(container: uri))
            #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")) == "/")
            try E2E.write(sb.mnt + "/before", "before the restart\n")
            #expect(E2E.sh("sync '\(sb.mnt)/before'").ok)
            try server.cluster.restart()
            try E2E.write(sb.mnt + "/after", "after the restart\n")
            let synced = E2E.sh("sync '\(sb.mnt)/after'")
            #expect(synced.ok, "reconnected with the passfile and the authority by their absolute paths: \(synced)")
            #expect(E2E.readText(sb.mnt + "/before") == "before the restart\n")
            #expect(sb.unmount().ok)
        }
    }

    /// A `--config` file's relative paths are relative to it, the files named inside its URI too: mounted
    /// from "/", with the authority and the passfile given relative to conf/.
    @Test func aConfsURIFilesAreRelativeToTheConf() throws {
        try withServer("pgtlsconf") { server, sb, pgpass in
            let absolute = server.uri(passfile: pgpass, container: "tls_conf")
            try #require(sb.initContainer(container: absolute).ok)
            let authority = "../../" + (server.certificates.authority.dropFirst("/tmp/".count))
            let uri =
                "postgresql://\(server.role)@localhost:\(server.cluster.port)/\(server.cluster.database)?sslmode=verify-full"
                + "&sslrootcert=\(authority)&passfile=../pgpass&container=tls_conf"
            let conf = try sb.writeConf("container = \(uri)\nmountpoint = ../m\npassfile = ../pass\n")
            let m = E2E.sh("cd / && '\(E2E.coffer)' mount --config '\(conf)'")
            // The daemon's argv carries the URI with its files joined to conf/ (`PostgresLocation.withFiles`).
            let joined = uri.replacingOccurrences(of: "sslrootcert=", with: "sslrootcert=\(sb.root)/conf/")
                .replacingOccurrences(of: "passfile=", with: "passfile=\(sb.root)/conf/")
            sb.noteDaemon(container: joined)
            try #require(m.ok, "\(m)")
            #expect(E2E.daemonPid(container: joined) != nil, "the daemon is found by the URI it was given")
            try E2E.write(sb.mnt + "/via-conf", "x")
            #expect(E2E.sh("sync '\(sb.mnt)/via-conf'").ok)
            #expect(sb.unmount().ok)
        }
    }

    /// A certificate from another authority, a host name the certificate does not carry, a root certificate
    /// file that is missing: each is refused at once with libpq's reason, status 10, and the container
    /// stays as it was (it mounts with the right settings afterwards).
    @Test func aServerTheTLSSettingsRefuseIsNotAServerAway() throws {
        try withServer("pgtlsno") { server, sb, pgpass in
            let good = server.uri(passfile: pgpass, container: "tls_refused")
            try #require(sb.initContainer(container: good).ok)
            let refused: [(String, String, String)] = [
                (
                    "another authority", server.uri(authority: server.certificates.otherAuthority, passfile: pgpass, container: "tls_refused"),
                    "certificate verify failed"
                ),
                (
                    "a host the certificate does not name", server.uri(host: "127.0.0.1", passfile: pgpass, container: "tls_refused"),
                    "does not match host name"
                ),
                (
                    "no root certificate file", server.uri(authority: sb.root + "/missing.crt", passfile: pgpass, container: "tls_refused"),
                    "does not exist"
                )
            ]
            for (what, uri, reason) in refused {
                let started = Date()
                let info = E2E.coffer(["info", uri])
                #expect(info.status == 10 && info.stderr.contains(reason), "\(what): \(info)")
                #expect(!info.stderr.contains("cannot connect to the server"), "\(what) is not a server away: \(info)")
                let mount = sb.mount(container: uri)
                #expect(mount.status == 10 && mount.stderr.contains(reason), "\(what): \(mount)")
                #expect(Date().timeIntervalSince(started) < 20, "\(what): refused at once, not waited for")
                #expect(!E2E.isMounted(sb.mnt))
            }
            // A server that is away stays 19 with the same TLS settings (the refusal is not read into every failure).
            try server.cluster.stop()
            let away = E2E.coffer(["info", good])
            #expect(away.status == 19 && away.stderr.contains("cannot connect to the server"), "\(away)")
            try server.cluster.start()
            let m = sb.mount(container: good)
            try #require(m.ok, "\(m)")
            #expect(sb.unmount().ok)
        }
    }
}
