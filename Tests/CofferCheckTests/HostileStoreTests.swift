import Foundation
import Glibc
import GRDB
import CofferTestSupport
import Testing
@testable import CofferCheck
@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

/// Seeded random damage to every table (flipped bytes, deleted, cut, copied and swapped rows): the
/// check never throws or traps, the repair leaves a store a second check finds clean, and every file
/// the repaired tree holds reads without an error. A failing seed is printed.
@Suite("fsck: hostile stores") struct HostileStoreTests {
    static let seeds: Range<UInt64> = 0..<120

    @Test func randomDamageIsRepairedToACleanReadableStore() throws {
        let template = try CheckFixture()
        defer { template.cleanup() }
        var g = SplitMix64(seed: 99)
        let docs = try template.mkdir("docs")
        let sub = try template.mkdir("sub", in: docs)
        let small = try template.file("small.txt", in: docs, b("hello"))
        try template.file("big.bin", in: docs, g.bytes(12 * 4096 + 7))
        try template.file("three.bin", in: sub, g.bytes(3 * 4096))
        try template.file("sparse.bin")
        try template.write("/sparse.bin", at: 9 * 4096, b("end"))
        let fs = try template.mounted
        _ = try fs.link(small, newParent: sub, newName: b("hard"))
        _ = try fs.symlink(parent: rootIno, name: b("ln"), target: b("docs"), caller: caller)
        try fs.setxattr(small, name: b("user.a"), value: b("1"), flags: 0)
        template.unmount()
        let clean = try template.check()
        try #require(clean.isClean, "\(kinds(clean))")

        var failures: [String] = []
        var detected = 0
        for seed in Self.seeds {
            let fx = try template.copy()
            defer { fx.cleanup() }
            var rng = SplitMix64(seed: seed)
            var done: [String] = []
            for _ in 0..<1 + Int(rng.next() % 3) { done.append(try fx.edit { try damage($0, &rng) }) }
            let what = "seed \(seed) (\(done.joined(separator: "; ")))"
            let found: CheckResult
            do { found = try fx.check() } catch {
                failures.append("\(what): check threw \(error)")
                continue
            }
            if !found.isClean { detected += 1 }
            do { _ = try fx.repair(found) } catch {
                failures.append("\(what): repair threw \(error)")
                continue
            }
            let after = try fx.check()
            if !after.isClean {
                failures.append("\(what): left after repair: \(kinds(after))")
                continue
            }
            do {
                try fx.mount()
                _ = try fx.readAll()
            } catch { failures.append("\(what): reading the repaired tree: \(error)") }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
        #expect(detected >= Self.seeds.count / 2, "most random damage must be noticed (\(detected) of \(Self.seeds.count))")
    }
}

/// One random change to one random row of one table, as an attacker with sqlite3 would make it.
func damage(_ s: EntityStore, _ g: inout SplitMix64) throws -> String {
    let tables: [(String, [String])] = [
        ("inodes", ["id"]), ("dirents", ["parent", "tag"]), ("chunks", ["file", "idx"]),
        ("xattrs", ["inode", "tag"]), ("chunkmaps", ["file", "page"])
    ]
    let (table, keys) = tables[Int(g.next() % UInt64(tables.count))]
    let op = Int(g.next() % 7)
    var rng = g
    defer { g = rng }
    return try s.sqlite.write { db -> String in
        let n = try Int.fetchOne(db, sql: "SELECT count(*) FROM \(table)") ?? 0
        guard n > 0 else { return "\(table): empty" }
        let columns = keys.joined(separator: ", ") + ", value"
        func row(_ k: Int) throws -> Row? { try Row.fetchOne(db, sql: "SELECT \(columns) FROM \(table) LIMIT 1 OFFSET \(k)") }
        guard let r = try row(Int(rng.next() % UInt64(n))) else { return "\(table): no row" }
        let keyValues: [DatabaseValue] = keys.indices.map { r[$0] as DatabaseValue }
        let match = keys.map { "\($0) = ?" }.joined(separator: " AND ")
        var value = (r[keys.count] as Data?).map { [UInt8]($0) } ?? []
        func update(_ v: [UInt8]) throws {
            try db.execute(sql: "UPDATE \(table) SET value = ? WHERE \(match)", arguments: StatementArguments([Data(v).databaseValue] + keyValues))
        }
        switch op {
        case 0:
            guard !value.isEmpty else { return "\(table): empty value" }
            let i = Int(rng.next() % UInt64(value.count))
            value[i] ^= UInt8(1 << (rng.next() % 8))
            try update(value)
            return "\(table): flipped byte \(i)"
        case 1:
            try db.execute(sql: "DELETE FROM \(table) WHERE \(match)", arguments: StatementArguments(keyValues))
            return "\(table): deleted a row"
        case 2:
            let keep = value.isEmpty ? 0 : Int(rng.next() % UInt64(value.count))
            try update(Array(value.prefix(keep)))
            return "\(table): cut a value to \(keep) bytes"
        case 3:
            // The same value under another key of the same table.
            var moved = keyValues
            let last = keys.count - 1
            if let i = Int64.fromDatabaseValue(moved[last]) {
                moved[last] = (i + 1 + Int64(rng.next() % 20)).databaseValue
            } else {
                moved[last] = Data(rng.bytes(16)).databaseValue
            }
            try db.execute(
                sql: "INSERT OR REPLACE INTO \(table)(\(columns)) VALUES (\(Array(repeating: "?", count: keys.count + 1).joined(separator: ", ")))",
                arguments: StatementArguments(moved + [Data(value).databaseValue]))
            return "\(table): copied a row to another key"
        case 5:
            // A key SQLite keeps as given: a real or text where Coffer writes integers, text where it writes blobs.
            let last = keys.count - 1
            let odd: DatabaseValue =
                Int64.fromDatabaseValue(keyValues[last]) != nil
                ? (rng.next() % 2 == 0 ? (Double(rng.next() % 8) + 0.5).databaseValue : "x\(rng.next() % 8)".databaseValue)
                : "tag".databaseValue
            do {
                try db.execute(
                    sql: "UPDATE OR REPLACE \(table) SET \(keys[last]) = ? WHERE \(match)", arguments: StatementArguments([odd] + keyValues))
            } catch { return "\(table): key \(keys[last]) set to \(odd): refused by SQLite" }  // an INTEGER PRIMARY KEY takes integers only
            return "\(table): key \(keys[last]) set to \(odd)"
        case 6:
            // The value as text (same bytes, another type).
            try db.execute(
                sql: "UPDATE \(table) SET value = CAST(value AS TEXT) WHERE \(match)", arguments: StatementArguments(keyValues))
            return "\(table): value made text"
        default:
            guard let other = try row(Int(rng.next() % UInt64(n))) else { return "\(table): no second row" }
            let otherValue = (other[keys.count] as Data?).map { [UInt8]($0) } ?? []
            let otherKeys: [DatabaseValue] = keys.indices.map { other[$0] as DatabaseValue }
            try update(otherValue)
            try db.execute(
                sql: "UPDATE \(table) SET value = ? WHERE \(match)", arguments: StatementArguments([Data(value).databaseValue] + otherKeys))
            return "\(table): swapped two values"
        }
    }
}
