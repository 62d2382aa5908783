import Foundation

/// The frozen containers under Tests/Fixtures (one directory per format version or form, never regenerated):
/// where they are, what their manifest says, and how what a test saw differs from it. Found from this
/// source file's path, so a clean clone (CI) has them without any copying step.
public enum FormatFixture {
    /// The frozen fixtures: format 1 with whole-sealed chunks, and with chunks sealed in 4 KiB blocks.
    public static let all = ["format-1", "format-1-blocks"]

    /// Tests/Fixtures/`name`.
    public static func directory(_ name: String = "format-1") -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/\(name)").path
    }

    /// The password, first line of the `password` file beside the container.
    public static func password(_ name: String = "format-1") throws -> String {
        try firstLine(directory(name) + "/password")
    }

    /// The recovery key `coffer init` printed for the fixture.
    public static func recoveryKey(_ name: String = "format-1") throws -> String {
        try firstLine(directory(name) + "/recovery-key")
    }

    public static func manifest(_ name: String = "format-1") throws -> Manifest {
        let data = try Data(contentsOf: URL(fileURLWithPath: directory(name) + "/manifest.json"))
        return try JSONDecoder().decode(Manifest.self, from: data)
    }

    /// Copies the container directory to `destination` (which must not exist): tests never touch the original.
    public static func copyContainer(_ name: String = "format-1", to destination: String) throws {
        try FileManager.default.copyItem(atPath: directory(name) + "/container", toPath: destination)
    }

    private static func firstLine(_ path: String) throws -> String {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        return String(text.split(separator: "\n", omittingEmptySubsequences: false).first ?? "")
    }

    public struct Manifest: Decodable {
        public let format: Int
        public let chunkSize: Int
        public let entries: [Entry]
    }

    /// One path as the fixture's manifest describes it (and as a test records what it saw). A symlink
    /// target inside the mount starts with `mountpointToken`; such a symlink has no `size`.
    public struct Entry: Codable, Equatable, Sendable {
        public var path: String
        public var type: String
        /// Permission bits with set-id and sticky, four octal digits.
        public var mode: String
        public var uid: UInt32
        public var gid: UInt32
        public var size: UInt64?
        public var blocks: UInt64?
        public var nlink: UInt64
        /// "seconds.nanoseconds", nine digits after the point.
        public var mtime: String
        public var target: String?
        /// Name -> value in hex (absent for symlinks).
        public var xattrs: [String: String]?
        public var sha256: String?

        public init(
            path: String, type: String, mode: UInt32, uid: UInt32, gid: UInt32, size: UInt64?, blocks: UInt64?,
            nlink: UInt64, mtime: (seconds: Int64, nanoseconds: Int64), target: String? = nil,
            xattrs: [String: String]? = nil, sha256: String? = nil
        ) {
            self.path = path
            self.type = type
            self.mode = String(format: "%04o", mode & 0o7777)
            self.uid = uid
            self.gid = gid
            self.size = size
            self.blocks = blocks
            self.nlink = nlink
            self.mtime = String(format: "%lld.%09lld", mtime.seconds, mtime.nanoseconds)
            self.target = target
            self.xattrs = xattrs
            self.sha256 = sha256
        }
    }

    public static let mountpointToken = "{mountpoint}"

    /// Every difference between the manifest and what was seen, one line each (empty: identical).
    public static func differences(expected: [Entry], seen: [Entry]) -> [String] {
        var out: [String] = []
        let want = Dictionary(uniqueKeysWithValues: expected.map { ($0.path, $0) })
        let got = Dictionary(uniqueKeysWithValues: seen.map { ($0.path, $0) })
        for path in want.keys.sorted() where got[path] == nil { out.append("\(path): missing") }
        for path in got.keys.sorted() where want[path] == nil { out.append("\(path): not in the manifest") }
        for path in want.keys.sorted() {
            guard let w = want[path], let g = got[path], w != g else { continue }
            out.append("\(path): expected \(w), saw \(g)")
        }
        return out
    }
}

extension Array where Element == UInt8 {
    /// Lowercase hex, as the manifest writes xattr values and digests.
    public var fixtureHex: String { map { String(format: "%02x", $0) }.joined() }
}
