import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The "Foundation" issue: init, info, passwd and header authentication, through the built binary.

/// Key slots listed by `coffer info`: (id, kind).
func slots(inInfo text: String) -> [(id: String, kind: String)] {
    text.split(separator: "\n").compactMap { line in
        let f = line.split(separator: " ", omittingEmptySubsequences: true)
        guard line.hasPrefix("  "), f.count >= 2, f[0].count == 16, f[0].allSatisfy(\.isHexDigit) else { return nil }
        return (String(f[0]), String(f[1]))
    }
}

/// The recovery key printed by init: 8 groups of 8 hex digits.
func recoveryKey(inInitOutput text: String) -> String? {
    let pattern = try! NSRegularExpression(pattern: "[0-9a-fA-F]{8}(-[0-9a-fA-F]{8}){7}")
    let range = NSRange(text.startIndex..., in: text)
    guard let m = pattern.firstMatch(in: text, range: range), let r = Range(m.range, in: text) else { return nil }
    return String(text[r])
}

/// Every file of a directory (recursively) with its bytes, for before/after comparisons.
func containerFiles(_ dir: String) -> [String: [UInt8]] { E2E.snapshot(dir) }

@Suite("CLI: init, info, passwd, header")
struct CLITests {
    @Test func binaryIsFound() {
        #expect(E2E.isExecutableFile(E2E.coffer), "coffer binary not found next to the test bundle (looked from /proc/self/exe); got \(E2E.coffer)")
        let r = E2E.coffer(["--help"])
        #expect(r.ok, "\(r)")
        #expect(r.stdout.contains("init") && r.stdout.contains("mount"), "\(r)")
    }

    @Test func initWithPassfileCreatesAContainerThatOpens() throws {
        let sb = try Sandbox("initpass")
        defer { sb.cleanup() }
        let r = sb.initContainer()
        try #require(r.ok, "\(r)")
        #expect(FileManager.default.fileExists(atPath: sb.container + "/coffer.json"))
        #expect(recoveryKey(inInitOutput: r.stdout) != nil, "init printed no recovery key: \(r)")
        #expect(!r.stdout.contains(sb.password) && !r.stderr.contains(sb.password), "init printed the password")
        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(info.ok, "\(info)")
        #expect(info.stdout.contains("Unlocked by:"), "\(info)")
    }

    @Test func initWithExtpass() throws {
        let sb = try Sandbox("initext")
        defer { sb.cleanup() }
        let r = E2E.coffer(["init", sb.container, "--extpass", "echo \(sb.password)"] + Sandbox.kdfArgs)
        try #require(r.ok, "\(r)")
        // The password file holds the same password: it opens.
        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(info.ok, "\(info)")
        let wrong = E2E.coffer(["info", sb.container, "--extpass", "echo not-\(sb.password)"])
        #expect(wrong.status == 12, "\(wrong)")
        let failing = E2E.coffer(["info", sb.container, "--extpass", "exit 3"])
        #expect(failing.status == 17, "a failing --extpass command must be bad password input: \(failing)")
        #expect(failing.stderr.contains("failed with status 3"), "it said it gave an empty password: \(failing)")
    }

    @Test(.enabled(if: E2E.python != nil, "python3 is needed to drive a terminal"))
    func initWithTerminalPrompt() throws {
        let sb = try Sandbox("initpty")
        defer { sb.cleanup() }
        let r = E2E.onTerminal(
            [E2E.coffer, "init", sb.container] + Sandbox.kdfArgs,
            answers: [("New password: ", sb.password), ("Repeat: ", sb.password)])
        try #require(r.status == 0, "\(r)")
        #expect(r.stdout.contains("Created container"), "\(r)")
        #expect(!r.stdout.contains(sb.password), "the password was echoed on the terminal: \(r)")
        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(info.ok, "the prompted password does not open the container: \(info)")
    }

    @Test(.enabled(if: E2E.python != nil, "python3 is needed to drive a terminal"))
    func initPromptMismatchIsRefused() throws {
        let sb = try Sandbox("initmis")
        defer { sb.cleanup() }
        let r = E2E.onTerminal(
            [E2E.coffer, "init", sb.container] + Sandbox.kdfArgs,
            answers: [("New password: ", "first-\(sb.password)"), ("Repeat: ", "second-\(sb.password)")])
        #expect(r.status == 17, "\(r)")
        #expect(r.stdout.contains("do not match"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: sb.container + "/coffer.json"), "a container was created anyway")
    }

    @Test func initWithoutTerminalOrSecretFails() throws {
        let sb = try Sandbox("initnotty")
        defer { sb.cleanup() }
        // setsid: no controlling terminal, so no prompt is possible.
        let r = E2E.run("/usr/bin/setsid", [E2E.coffer, "init", sb.container] + Sandbox.kdfArgs)
        #expect(r.status == 17, "\(r)")
        #expect(!FileManager.default.fileExists(atPath: sb.container + "/coffer.json"))
    }

    @Test func initIntoNonEmptyDirectoryIsRefusedAndLeavesItAlone() throws {
        let sb = try Sandbox("initnonempty")
        defer { sb.cleanup() }
        let dir = sb.root + "/full"
        try #require(mkdir(dir, 0o755) == 0)
        try E2E.write(dir + "/keep.txt", "precious\n")
        try #require(mkdir(dir + "/sub", 0o755) == 0)
        try E2E.write(dir + "/sub/x", [1, 2, 3])
        let before = containerFiles(dir)
        let beforeList = try FileManager.default.subpathsOfDirectory(atPath: dir).sorted()
        let r = sb.initContainer(container: dir)
        #expect(r.status == 10, "\(r)")
        #expect(r.stderrLines.count == 1, "\(r)")
        #expect(containerFiles(dir) == before, "the directory's files changed")
        #expect(try FileManager.default.subpathsOfDirectory(atPath: dir).sorted() == beforeList, "the directory's listing changed")
    }

    @Test func initWithoutRecoveryKey() throws {
        let sb = try Sandbox("initnorec")
        defer { sb.cleanup() }
        let r = sb.initContainer(["--no-recovery-key"])
        try #require(r.ok, "\(r)")
        #expect(recoveryKey(inInitOutput: r.stdout) == nil, "\(r)")
        #expect(!r.stdout.lowercased().contains("recovery key"), "\(r)")
        let info = E2E.coffer(["info", sb.container])
        #expect(info.ok, "\(info)")
        #expect(info.stdout.contains("Key slots:      1"), "\(info)")
        #expect(slots(inInfo: info.stdout).count == 1, "\(info)")
        #expect(slots(inInfo: info.stdout).first?.kind == "password", "\(info)")
    }

    @Test func infoWithoutSecretShowsTheHeaderOnly() throws {
        let sb = try Sandbox("info")
        defer { sb.cleanup() }
        let i = sb.initContainer()
        try #require(i.ok, "\(i)")
        let rk = try #require(recoveryKey(inInitOutput: i.stdout))
        let r = E2E.coffer(["info", sb.container])
        try #require(r.ok, "\(r)")
        #expect(r.stdout.contains("version 1"), "\(r)")
        #expect(r.stdout.contains("AES-256-GCM"), "\(r)")
        let header = try #require(E2E.readText(sb.container + "/coffer.json"))
        let chunk = try #require(HeaderEdit.chunkSize(in: header), "no chunkSize in \(header)")
        #expect(r.stdout.contains("\(chunk / 1024) KiB chunks"), "chunk size \(chunk) not shown: \(r)")
        #expect(r.stdout.contains("scrypt N=2^16 r=8 p=1"), "KDF parameters missing: \(r)")
        #expect(r.stdout.contains("Key slots:      2"), "\(r)")
        let kinds = slots(inInfo: r.stdout).map(\.kind).sorted()
        #expect(kinds == ["password", "recovery"], "\(r)")
        #expect(!r.stdout.contains("Entities:"), "counts shown without a secret: \(r)")
        let all = r.stdout + r.stderr
        #expect(!all.contains(rk) && !all.contains(rk.replacingOccurrences(of: "-", with: "")), "info printed the recovery key")
        #expect(!all.contains(sb.password), "info printed the password")
    }

    @Test func infoWithPassfileShowsCounts() throws {
        let sb = try Sandbox("infocounts")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let r = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        try #require(r.ok, "\(r)")
        #expect(
            r.stdout.range(of: #"Entities:\s+\d+ inodes, \d+ directory entries, \d+ content chunks, \d+ xattrs"#, options: .regularExpression) != nil,
            "\(r)")
        #expect(!(r.stdout + r.stderr).contains(sb.password))
    }

    @Test func infoWrongPasswordChangesNothing() throws {
        let sb = try Sandbox("infowrong")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let before = containerFiles(sb.container)
        try #require(!before.isEmpty)
        let bad = sb.root + "/bad"
        try E2E.write(bad, "not-the-password\n")
        let r = E2E.coffer(["info", sb.container, "--passfile", bad])
        #expect(r.status == 12, "\(r)")
        #expect(r.stderrLines.count == 1, "expected one line on stderr: \(r)")
        #expect(!r.stdout.contains("Entities:"), "\(r)")
        #expect(containerFiles(sb.container) == before, "container files changed after a failed unlock")
    }

    @Test func infoOnMissingOrForeignDirectory() throws {
        let sb = try Sandbox("infomissing")
        defer { sb.cleanup() }
        let missing = E2E.coffer(["info", sb.root + "/nope"])
        #expect(missing.status == 10, "\(missing)")
        #expect(missing.stderrLines.count == 1, "\(missing)")
        let foreign = sb.root + "/foreign"
        try #require(mkdir(foreign, 0o755) == 0)
        try E2E.write(foreign + "/notes.txt", "hello")
        let r = E2E.coffer(["info", foreign])
        #expect(r.status == 10, "\(r)")
        #expect(r.stderr.contains("not a Coffer container"), "\(r)")
        let withPass = E2E.coffer(["info", foreign, "--passfile", sb.passfile])
        #expect(withPass.status == 10, "\(withPass)")
    }

    @Test func passwdChangesThePassword() throws {
        let sb = try Sandbox("passwd")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let newPass = sb.root + "/new"
        try E2E.write(newPass, "brand-new-\(sb.password)\n")
        let r = E2E.coffer(["passwd", sb.container, "--passfile", sb.passfile, "--new-passfile", newPass] + Sandbox.kdfArgs)
        try #require(r.ok, "\(r)")
        let old = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(old.status == 12, "the old password still opens: \(old)")
        let new = E2E.coffer(["info", sb.container, "--passfile", newPass])
        #expect(new.ok, "the new password does not open: \(new)")
        let info = E2E.coffer(["info", sb.container])
        #expect(slots(inInfo: info.stdout).count == 2, "a password change must not add slots: \(info)")
    }

    /// `coffer passwd` of a mounted container: the header's rewrite locks the header file, not the directory
    /// (whose flock is the mount's), so it goes ahead while mounted and the mount is still found as the holder.
    @Test func passwdWhileMounted() throws {
        let sb = try Sandbox("passwdmounted")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let second = sb.root + "/second"
        try E2E.write(second, "second-\(sb.password)\n")
        let add = E2E.coffer(
            ["passwd", sb.container, "--passfile", sb.passfile, "--add-password", "--new-passfile", second] + Sandbox.kdfArgs, timeout: 30)
        #expect(add.ok, "\(add)")
        #expect(E2E.coffer(["info", sb.container, "--passfile", second]).ok)
        #expect(E2E.daemonPid(container: sb.container) != nil, "the mount still holds its lock")
        #expect(sb.unmount().ok)
    }

    /// Six `coffer passwd --add-password` at once: each either adds its slot (and its password then opens
    /// the container) or says the header changed under it and writes nothing. All six said "added" and five
    /// of the passwords did not open: each wrote the header it had read plus its own slot (a tester's find).
    @Test func passwdsAtOnceLoseNoSlotTheyReport() throws {
        let sb = try Sandbox("passwdrace")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        var script = ""
        for i in 0..<6 {
            try E2E.write(sb.root + "/p\(i)", "password-\(i)-\(sb.password)\n")
            let args = (["passwd", sb.container, "--passfile", sb.passfile, "--add-password", "--new-passfile", sb.root + "/p\(i)"] + Sandbox.kdfArgs)
            script += "('\(E2E.coffer)' \(args.map { "'\($0)'" }.joined(separator: " ")) > \(sb.root)/out\(i) 2>&1; echo $? > \(sb.root)/rc\(i)) &\n"
        }
        #expect(E2E.sh(script + "wait", timeout: 120).ok)
        var added = 0
        for i in 0..<6 {
            let rc = E2E.readText(sb.root + "/rc\(i)")?.trimmingCharacters(in: .whitespacesAndNewlines)
            let out = E2E.readText(sb.root + "/out\(i)") ?? ""
            let opens = E2E.coffer(["info", sb.container, "--passfile", sb.root + "/p\(i)"]).ok
            if rc == "0" {
                added += 1
                #expect(opens, "passwd \(i) said it added its slot, but its password does not open: \(out)")
            } else {
                #expect(!opens && out.contains("header changed"), "passwd \(i): \(String(describing: rc)) \(out)")
            }
        }
        #expect(added >= 1)
        #expect(slots(inInfo: E2E.coffer(["info", sb.container]).stdout).count == 2 + added, "one slot per success")
    }

    @Test func passwdAddsPasswordAndKeyFileAndRemovesSlots() throws {
        let sb = try Sandbox("slots")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let second = sb.root + "/second"
        try E2E.write(second, "second-\(sb.password)\n")
        let add = E2E.coffer(["passwd", sb.container, "--passfile", sb.passfile, "--add-password", "--new-passfile", second] + Sandbox.kdfArgs)
        try #require(add.ok, "\(add)")
        #expect(E2E.coffer(["info", sb.container, "--passfile", second]).ok, "the added password does not open")
        #expect(E2E.coffer(["info", sb.container, "--passfile", sb.passfile]).ok, "the first password stopped working")

        let keyfile = sb.root + "/key.bin"
        try E2E.write(keyfile, E2E.randomBytes(64))
        let addKey = E2E.coffer(["passwd", sb.container, "--passfile", sb.passfile, "--add-keyfile", keyfile] + Sandbox.kdfArgs)
        try #require(addKey.ok, "\(addKey)")
        let byKey = E2E.coffer(["info", sb.container, "--keyfile", keyfile])
        #expect(byKey.ok, "\(byKey)")
        let otherKey = sb.root + "/other.bin"
        try E2E.write(otherKey, E2E.randomBytes(64))
        #expect(E2E.coffer(["info", sb.container, "--keyfile", otherKey]).status == 12, "a random key file opens the container")

        let info = E2E.coffer(["info", sb.container])
        let listed = slots(inInfo: info.stdout)
        #expect(listed.map(\.kind).sorted() == ["keyfile", "password", "password", "recovery"], "\(info)")
        // Which password slot is the second one? The one whose removal makes `second` fail.
        let unlockedBySecond = E2E.coffer(["info", sb.container, "--passfile", second]).stdout
        let secondId = try #require(listed.first { unlockedBySecond.contains("slot \($0.id)") }?.id, "\(unlockedBySecond)")
        let rm = E2E.coffer(["passwd", sb.container, "--passfile", sb.passfile, "--remove-slot", secondId])
        try #require(rm.ok, "\(rm)")
        #expect(E2E.coffer(["info", sb.container, "--passfile", second]).status == 12, "the removed slot still opens")
        #expect(E2E.coffer(["info", sb.container, "--passfile", sb.passfile]).ok)
        #expect(E2E.coffer(["info", sb.container, "--keyfile", keyfile]).ok)
        #expect(slots(inInfo: E2E.coffer(["info", sb.container]).stdout).count == 3)
    }

    @Test func removingTheLastSlotIsRefused() throws {
        let sb = try Sandbox("lastslot")
        defer { sb.cleanup() }
        try #require(sb.initContainer(["--no-recovery-key"]).ok)
        let only = try #require(slots(inInfo: E2E.coffer(["info", sb.container]).stdout).first)
        let before = containerFiles(sb.container)
        let r = E2E.coffer(["passwd", sb.container, "--passfile", sb.passfile, "--remove-slot", only.id])
        #expect(r.status != 0, "\(r)")
        #expect(r.stderr.contains("last"), "\(r)")
        let after = slots(inInfo: E2E.coffer(["info", sb.container]).stdout)
        #expect(after.map(\.id) == [only.id])
        #expect(containerFiles(sb.container) == before)
        #expect(E2E.coffer(["info", sb.container, "--passfile", sb.passfile]).ok)
    }

    @Test func recoveryKeyOpensTheContainer() throws {
        let sb = try Sandbox("recovery")
        defer { sb.cleanup() }
        let i = sb.initContainer()
        try #require(i.ok)
        let rk = try #require(recoveryKey(inInitOutput: i.stdout), "\(i)")
        let rkFile = sb.root + "/rk"
        try E2E.write(rkFile, rk + "\n")
        let r = E2E.coffer(["info", sb.container, "--passfile", rkFile])
        #expect(r.ok, "\(r)")
        let recoveryId = slots(inInfo: r.stdout).first { $0.kind == "recovery" }?.id
        #expect(recoveryId != nil && r.stdout.contains("Unlocked by:    slot \(recoveryId!)"), "\(r)")
        // A wrong recovery key (one digit changed) does not open.
        var chars = Array(rk)
        chars[0] = chars[0] == "0" ? "1" : "0"
        try E2E.write(rkFile, String(chars) + "\n")
        #expect(E2E.coffer(["info", sb.container, "--passfile", rkFile]).status == 12)
        // The recovery key can set a new password (the lost-password path).
        try E2E.write(rkFile, rk + "\n")
        let newPass = sb.root + "/new"
        try E2E.write(newPass, "after-recovery\n")
        let p = E2E.coffer(["passwd", sb.container, "--passfile", rkFile, "--new-passfile", newPass] + Sandbox.kdfArgs)
        #expect(p.ok, "\(p)")
        #expect(E2E.coffer(["info", sb.container, "--passfile", newPass]).ok)
        #expect(E2E.coffer(["info", sb.container, "--passfile", rkFile]).ok, "the recovery slot must stay")
    }

    enum HeaderEdit: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case chunkSize, featureAdded, cipherChanged, kdfWeakened, labelChanged
        var testDescription: String { rawValue }

        func apply(_ text: String) -> String {
            func sub(_ pattern: String, _ template: String) -> String {
                let re = try! NSRegularExpression(pattern: pattern)
                return re.stringByReplacingMatches(in: text, range: NSRange(text.startIndex..., in: text), withTemplate: template)
            }
            switch self {
            case .chunkSize:
                // Another valid size, so that only the MAC can tell.
                let other = Self.chunkSize(in: text) == 16384 ? 65536 : 16384
                return sub(#""chunkSize"\s*:\s*\d+"#, "\"chunkSize\" : \(other)")
            case .featureAdded: return sub(#""features"\s*:\s*\[\s*\]"#, #""features" : ["compression"]"#)
            case .cipherChanged: return sub(#""cipher"\s*:\s*"AES-256-GCM""#, #""cipher" : "AES-128-CTR""#)
            case .kdfWeakened: return sub(#""logN"\s*:\s*16"#, #""logN" : 10"#)
            case .labelChanged: return sub(#""label"\s*:\s*"password""#, #""label" : "pwned""#)
            }
        }

        static func chunkSize(in text: String) -> Int? {
            guard let r = text.range(of: #""chunkSize"\s*:\s*\d+"#, options: .regularExpression) else { return nil }
            return Int(text[r].split(separator: ":").last!.trimmingCharacters(in: .whitespaces))
        }

        /// A word the refusal message must contain.
        var messageWord: String {
            switch self {
            case .chunkSize, .labelChanged: return "authentication"
            case .featureAdded: return "feature"
            case .cipherChanged: return "cipher"
            case .kdfWeakened: return "weaker"
            }
        }
    }

    @Test(arguments: HeaderEdit.allCases)
    func editedHeaderIsRefused(_ edit: HeaderEdit) throws {
        let sb = try Sandbox("hdr\(edit.rawValue)")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let path = sb.container + "/coffer.json"
        let original = try #require(E2E.readText(path))
        let edited = edit.apply(original)
        try #require(edited != original, "the edit did not apply to:\n\(original)")
        try E2E.write(path, edited)

        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(info.status == 11, "\(info)")
        #expect(info.stderr.contains(edit.messageWord), "unclear message: \(info)")
        #expect(info.stderrLines.count == 1, "\(info)")
        #expect(!info.stdout.contains("Entities:"), "\(info)")

        let m = sb.mount()
        #expect(m.status == 11, "\(m)")
        #expect(m.stderr.contains(edit.messageWord), "\(m)")
        #expect(!E2E.isMounted(sb.mnt), "mounted despite an edited header")

        // Putting the original back makes it open again: the refusal was about the edit.
        try E2E.write(path, original)
        #expect(E2E.coffer(["info", sb.container, "--passfile", sb.passfile]).ok)
    }

    @Test func weakKDFIsRefusedAtInit() throws {
        let sb = try Sandbox("weakinit")
        defer { sb.cleanup() }
        let r = E2E.coffer(["init", sb.container, "--passfile", sb.passfile, "--kdf", "scrypt", "--scrypt-logn", "12"])
        #expect(r.status != 0, "\(r)")
        #expect(!FileManager.default.fileExists(atPath: sb.container + "/coffer.json"))
    }
}
