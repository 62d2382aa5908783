import CofferCrypto
import Foundation
import Synchronization
import CofferTestSupport
import Testing
@testable import CofferStore
import CofferStoreTestSupport

@Suite("PostgreSQL containers")
struct PostgresContainerTests {
    @Test func locationsParse() throws {
        #expect(try ContainerLocation.parse("/srv/vault") == .directory("/srv/vault"))
        #expect(try ContainerLocation.parse("postgres.dir") == .directory("postgres.dir"))
        guard
            case .postgres(let p) = try ContainerLocation.parse(
                "postgresql://alice:s3cret@db.example:5433/docs?sslmode=verify-full&container=team_a&passfile=/p")
        else {
            Issue.record("not a PostgreSQL location")
            return
        }
        #expect(p.container == "team_a")
        #expect(p.conninfo == "postgresql://alice:s3cret@db.example:5433/docs?sslmode=verify-full&passfile=/p", "every other libpq parameter is kept")
        #expect(p.display == "postgresql://alice@db.example:5433/docs?container=team_a")
        #expect(!"\(ContainerLocation.postgres(p))".contains("s3cret"))
        guard case .postgres(let d) = try ContainerLocation.parse("postgres:///docs") else {
            Issue.record("postgres:// is a URI too")
            return
        }
        #expect(d.container == "coffer" && d.conninfo == "postgres:///docs")
        #expect(try PostgresLocation(uri: "postgresql://h/db?container=My_Box2").container == "My_Box2")
        for bad in ["a-b", "1abc", "pg_catalog", "x\"y", "", String(repeating: "a", count: 64), "a%20b"] {
            #expect(throws: ContainerError.self, "\(bad)") { _ = try ContainerLocation.parse("postgresql://h/db?container=\(bad)") }
        }
        #expect(throws: ContainerError.self) { _ = try ContainerLocation.parse("postgresql://h/db?container=a&container=b") }
    }

    /// libpq's file parameters given relative are made absolute at parse time (the mount daemon leaves its
    /// working directory, and libpq opens them again at every reconnect); nothing else changes.
    @Test func relativeFileParametersBecomeAbsolute() throws {
        let cwd = try #require(
            FileManager.default.currentDirectoryPath.addingPercentEncoding(
                withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~/"))))
        let p = try PostgresLocation(
            uri: "postgresql://u@h/db?passfile=keys/pg%20pass&sslrootcert=/etc/ca.pem&sslkey=k.key&container=c&application_name=rel&sslcert=system")
        #expect(
            p.conninfo
                == "postgresql://u@h/db?passfile=\(cwd)/keys/pg%20pass&sslrootcert=/etc/ca.pem&sslkey=\(cwd)/k.key&application_name=rel&sslcert=\(cwd)/system",
            "\(p.conninfo)")
        #expect(try PostgresLocation(uri: "postgresql://h/db?sslrootcert=system").conninfo == "postgresql://h/db?sslrootcert=system")
        #expect(try PostgresLocation(uri: "postgresql://h/db?passfile=").conninfo == "postgresql://h/db?passfile=")
        #expect(
            try PostgresLocation(uri: "postgresql://h/db?sslkey=pkcs11:token").conninfo == "postgresql://h/db?sslkey=pkcs11:token", "an engine's key")
    }

    /// Which failed connections are refused for good (status 10, not retried) and which are a server away
    /// (19, retried), from libpq 15's and PostgreSQL 15's own messages.
    @Test func onlyPositiveEvidenceIsARefusal() {
        let cases: [(String, Bool, Bool)] = [
            ("FATAL:  password authentication failed for user \"alice\"", true, true),
            ("fe_sendauth: no password supplied", true, true),
            ("FATAL:  role \"alice\" does not exist", false, true),
            ("FATAL:  no pg_hba.conf entry for host \"10.0.0.2\", user \"alice\", database \"docs\", no encryption", false, true),
            ("invalid sslmode value: \"bogus\"", false, true),
            ("invalid URI query parameter: \"foo\"", false, true),
            ("definition of service \"x\" not found", false, true),
            ("connection to server at \"db\" (10.0.0.1), port 5432 failed: SSL error: certificate verify failed", false, true),
            ("server does not support SSL, but SSL was required", false, true),
            // The server away, also after the password was checked (full, or shutting down).
            ("FATAL:  remaining connection slots are reserved for non-replication superuser connections", true, false),
            ("FATAL:  sorry, too many clients already", true, false),
            ("FATAL:  the database system is starting up", false, false),
            ("FATAL:  the database system is shutting down", true, false),
            ("SSL connection has been closed unexpectedly", true, false),
            ("connection to server at \"db\" (10.0.0.1), port 5432 failed: Connection refused", false, false),
            ("could not translate host name \"db\" to address: Temporary failure in name resolution", false, false),
            ("connection to server on socket \"/run/postgresql/.s.PGSQL.5432\" failed: No such file or directory", false, false),
            // A server speaking German: not known as a refusal, so waited for (as before).
            ("FATAL:  Rolle »alice« existiert nicht", false, false)
        ]
        for (message, asked, refused) in cases {
            #expect(PGError.refusesForGood(message, askedForPassword: asked) == refused, "\(message)")
        }
    }

    @Test func createOpenUnlockAndChangeSlots() throws {
        let location = ContainerLocation.postgres(try TestPostgres.freshLocation())
        let made = try Container.create(location, password: secure(testPassword), options: fastOptions())
        #expect(made.container.location == location)
        #expect(made.recoveryKey != nil)
        let store = try made.container.openStore(keys: made.keys)
        try store.putInode(5, sampleInode(size: 5))
        store.close()
        #expect(
            containerError { _ = try Container.create(location, password: secure("x"), options: fastOptions()) }
                == .alreadyExists(location.description))

        let opened = try Container.open(location)
        #expect(opened.header == made.container.header)
        #expect(containerError { _ = try opened.unlock(passwordSecret("wrong")) } == .wrongSecret)
        let (keys, slot) = try opened.unlock(passwordSecret(testPassword))
        let reopened = try opened.openStore(keys: keys)
        #expect(try reopened.inode(5)?.size == 5)
        reopened.close()

        try opened.replaceSlot(id: slot, secret: secure("new password"), kdf: testKDF, keys: keys)
        let added = try opened.addSlot(kind: .password, secret: secure("second"), kdf: testKDF, label: "second", keys: keys)
        let again = try Container.open(location)
        #expect(containerError { _ = try again.unlock(passwordSecret(testPassword)) } == .wrongSecret)
        #expect(try again.unlock(passwordSecret("new password")).slotId == slot)
        #expect(try again.unlock(passwordSecret("second")).slotId == added)
        try again.removeSlot(id: added, keys: keys)
        #expect(containerError { _ = try Container.open(location).unlock(passwordSecret("second")) } == .wrongSecret)
        // `opened` read the header before that removal: its rewrite would bring the slot back, so it is refused.
        #expect(
            containerError { _ = try opened.addSlot(kind: .password, secret: secure("third"), kdf: testKDF, label: nil, keys: keys) }
                == .headerChanged)
        #expect(containerError { _ = try Container.open(location).unlock(passwordSecret("second")) } == .wrongSecret)
    }

    @Test func aHeaderEditedOnTheServerIsRefused() throws {
        let p = try TestPostgres.freshLocation()
        _ = try Container.create(.postgres(p), password: secure(testPassword), options: fastOptions(recovery: false))
        let q = PostgresIdentifier.quoted(p.container)
        try TestPostgres.cluster().psql(
            """
            UPDATE \(q).header SET value = convert_to(replace(convert_from(value, 'UTF8'), '"chunkSize" : 65536', '"chunkSize" : 4096'), 'UTF8')
            """)
        let edited = try Container.open(.postgres(p))
        #expect(edited.header.chunkSize == 4096)
        #expect(containerError { _ = try edited.unlock(passwordSecret(testPassword)) } == .headerTampered)
    }

    @Test func missingContainersAndServersAreClearErrors() throws {
        let p = try TestPostgres.freshLocation()
        guard case .unreadable(let shown, let why)? = containerError({ _ = try Container.open(.postgres(p)) }) else {
            Issue.record("a missing schema must be unreadable")
            return
        }
        #expect(shown == p.display && why.contains(p.container))
        let nowhere = try PostgresLocation(uri: "postgresql://nobody:hunter2secret@127.0.0.1:1/db?connect_timeout=2")
        guard case .unreachable(_, let message)? = containerError({ _ = try Container.open(.postgres(nowhere)) }) else {
            Issue.record("no server must be unreachable (not a missing container)")
            return
        }
        #expect(!message.contains("hunter2secret"), "\(message)")
        if case .notAStore? = storeError({ _ = try PostgresBackend.open(p) }) {} else { Issue.record("a missing schema is notAStore") }
    }

    /// The GRANTs README.md lists are enough: no superuser to create, and to use another's container.
    @Test func rolesWithTheDocumentedGrants() throws {
        let cluster = try TestPostgres.cluster()
        let tag = UUID().uuidString.prefix(8).lowercased()
        let (owner, user, name) = ("owner_\(tag)", "user_\(tag)", "team_\(tag)")
        try cluster.psql("CREATE ROLE \(owner) LOGIN; CREATE ROLE \(user) LOGIN; GRANT CONNECT, CREATE ON DATABASE \(cluster.database) TO \(owner)")
        func uri(_ role: String) -> String {
            "postgresql:///\(cluster.database)?host=\(cluster.socketDirectory)&port=\(cluster.port)&user=\(role)&container=\(name)"
        }
        let made = try Container.create(
            try ContainerLocation.parse(uri(owner)), password: secure(testPassword), options: fastOptions(recovery: false))
        try cluster.psql(
            "GRANT CONNECT ON DATABASE \(cluster.database) TO \(user); GRANT USAGE ON SCHEMA \(name) TO \(user); "
                + "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \(name) TO \(user)")
        let theirs = try Container.open(try ContainerLocation.parse(uri(user)))
        let (keys, _) = try theirs.unlock(passwordSecret(testPassword))
        let store = try theirs.openStore(keys: keys)
        defer { store.close() }
        try store.putInode(9, sampleInode(size: 9))
        try store.commit()
        #expect(try store.inode(9)?.size == 9)
        #expect(store.sizeOnDisk > 0)
        _ = try theirs.addSlot(kind: .password, secret: secure("more"), kdf: testKDF, label: nil, keys: made.keys)
    }

    /// A stopped mount of another role (its writer session holding the writer lock, its lease gone): a
    /// role without pg_signal_backend and pg_read_all_stats may not end it (nor see that it stalls), so
    /// its mount waits (no error) until the session ends; with the grants README.md lists as optional, it
    /// ends it and goes on.
    @Test func aStoppedWriterOfAnotherRoleIsEndedOnlyWithTheGrants() throws {
        let cluster = try TestPostgres.cluster()
        let tag = UUID().uuidString.prefix(8).lowercased()
        let (owner, user, name) = ("owner_\(tag)", "user_\(tag)", "team_\(tag)")
        try cluster.psql("CREATE ROLE \(owner) LOGIN; CREATE ROLE \(user) LOGIN; GRANT CONNECT, CREATE ON DATABASE \(cluster.database) TO \(owner)")
        func location(_ role: String) throws -> PostgresLocation {
            let uri = "postgresql:///\(cluster.database)?host=\(cluster.socketDirectory)&port=\(cluster.port)&user=\(role)&container=\(name)"
            guard case .postgres(let p) = try ContainerLocation.parse(uri) else { throw PGError(.usage, "not a URI") }
            return p
        }
        _ = try Container.create(.postgres(try location(owner)), password: secure(testPassword), options: fastOptions(recovery: false))
        try cluster.psql(
            "GRANT CONNECT ON DATABASE \(cluster.database) TO \(user); GRANT USAGE ON SCHEMA \(name) TO \(user); "
                + "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \(name) TO \(user)")
        let theirs = try Container.open(.postgres(try location(user)))
        let lease = try PostgresLease.take(try location(user), purpose: "mount", machine: "roles-b")
        defer { lease.release() }
        let (keys, _) = try theirs.unlock(passwordSecret(testPassword))
        let store = try theirs.openStore(keys: keys, leaseHolder: lease.me.holder)
        defer { store.close() }
        store.shareWithOtherMounts(floor: 0)
        try #require(store.backend as? PostgresBackend).lockSlice = 0.2
        for granted in [false, true] {
            if granted { try cluster.psql("GRANT pg_signal_backend, pg_read_all_stats TO \(user)") }
            // The owner's stopped mount: named after a holder with no lease row.
            let stuck = try PGConnection(try location(owner).conninfo)
            defer { stuck.close() }
            try stuck.execute("SELECT set_config('application_name', $1, false)", [.text(PostgresSQL.writerPrefix + "gone\(granted)")])
            try stuck.executeScript("BEGIN; SELECT pg_advisory_xact_lock(\(PostgresSQL.lockSpace), hashtext('\(name)'))")
            let began = Mutex(false)
            let failure = Mutex<(any Error)?>(nil)
            Thread {
                do { try store.beginGroup() } catch { failure.withLock { $0 = error } }
                began.withLock { $0 = true }
            }.start()
            let ended = waitUntil(granted ? 10 : 1.5, every: 0.05) { began.withLock { $0 } }
            #expect(ended == granted, granted ? "with pg_signal_backend the stopped session is ended" : "without it, it is waited for")
            stuck.close()
            #expect(waitUntil(10) { began.withLock { $0 } })
            #expect(failure.withLock { $0 } == nil, "\(String(describing: failure.withLock { $0 }))")
            try store.putInode(granted ? 11 : 10, sampleInode(size: 10))
            try store.commit(durable: true)
        }
        #expect(try store.inode(10)?.size == 10 && store.inode(11)?.size == 10)
    }
}
