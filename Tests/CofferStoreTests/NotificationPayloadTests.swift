import Testing

@testable import CofferStore

/// A commit's notification names its inodes; anyone with access to the server can send one on the
/// channel, so what does not parse names nothing (the receiver rereads instead), and it never traps.
@Suite("PostgreSQL notification payloads") struct NotificationPayloadTests {
    @Test func aCommitNamesItsInodesUpToTheLimit() {
        let some: Set<UInt64> = [1, 0xABC, UInt64.max]
        let parsed = PostgresSQL.parsePayload(PostgresSQL.commitPayload(holder: "h1", inodes: some))
        #expect(parsed.holder == "h1" && parsed.inodes.map(Set.init) == some)
        let limit = Set((1...UInt64(PostgresSQL.maxNamedInodes)))
        #expect(PostgresSQL.parsePayload(PostgresSQL.commitPayload(holder: "h", inodes: limit)).inodes?.count == limit.count)
        let over = limit.union([UInt64(PostgresSQL.maxNamedInodes) + 1])
        #expect(PostgresSQL.commitPayload(holder: "h", inodes: over) == "h", "too many to name: the holder alone")
        #expect(PostgresSQL.commitPayload(holder: "h", inodes: []) == "h")
    }

    @Test func whatDoesNotParseNamesNothing() {
        for payload in ["h", "h ", "h zz", "h 1,zz", "h -1", "h 10000000000000000", "h ,", " "] {
            #expect(PostgresSQL.parsePayload(payload).inodes == nil, "\(payload)")
        }
        #expect(PostgresSQL.parsePayload("h").holder == "h", "an older mount's payload: the holder alone")
        #expect(PostgresSQL.parsePayload("h a b").inodes == nil, "a second space is not an inode list")
    }
}
