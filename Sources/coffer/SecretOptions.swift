import ArgumentParser
import CofferCrypto
import CofferStore
import Foundation
import Glibc

/// Where a password comes from: a file or a command (else a prompt). All `init` takes.
struct PasswordSource: ParsableArguments {
    @Option(name: .customLong("passfile"), help: "Read the password from the first line of FILE.")
    var passfile: String?

    @Option(name: .customLong("extpass"), help: "Run CMD (with /bin/sh -c) and use the first line it prints as the password.")
    var extpass: String?

    /// A password, from the given source or a no-echo prompt (asked twice when `confirm`).
    func password(prompt: String, confirm: Bool) throws -> SecureBytes {
        if let passfile { return try SecretReader.firstLine(ofFile: passfile) }
        if let extpass { return try SecretReader.firstLine(ofCommand: extpass) }
        return try SecretReader.prompt(prompt, confirm: confirm)
    }
}

/// Where the secret that opens a container comes from; the same for every command.
struct SecretOptions: ParsableArguments {
    @OptionGroup var password: PasswordSource

    var passfile: String? {
        get { password.passfile }
        set { password.passfile = newValue }
    }

    var extpass: String? {
        get { password.extpass }
        set { password.extpass = newValue }
    }

    @Option(name: .customLong("keyfile"), help: "Open with a key file slot: the whole content of FILE is the secret.")
    var keyfile: String?

    @Option(name: .customLong("secret-fd"), help: .hidden)
    var secretFD: Int32?

    var isGiven: Bool { passfile != nil || extpass != nil || keyfile != nil || secretFD != nil }

    func validate() throws {
        if [passfile != nil, extpass != nil, keyfile != nil, secretFD != nil].filter({ $0 }).count > 1 {
            throw ValidationError("give only one of --passfile, --extpass, --keyfile")
        }
    }

    /// Fails as reading would when a given password or key file cannot be read, so that nothing is done
    /// (printed, prompted, started) for a secret that will not come.
    func checkSource() throws {
        if let passfile, access(passfile, R_OK) != 0 {
            throw SecretReader.fail("cannot read password file \(passfile): \(String(cString: strerror(errno)))")
        }
        if let keyfile, access(keyfile, R_OK) != 0 {
            throw SecretReader.fail("cannot read key file \(keyfile): \(String(cString: strerror(errno)))")
        }
    }

    /// The secret to open an existing container. Prompts once on a terminal when nothing else is given.
    func secret(prompt: String = "Password: ") throws -> Secret {
        if let keyfile { return Secret(kind: .keyFile, bytes: try SecretReader.keyFile(keyfile)) }
        if let fd = secretFD { return Secret.fromPassword(try SecretReader.readAll(fd: fd, what: "the secret pipe")) }
        return Secret.fromPassword(try password(prompt: prompt, confirm: false))
    }

    /// Reads the secret and unlocks `container` with it; the secret is wiped on every path.
    func unlock(_ container: Container) throws -> (keys: ContainerKeys, slotId: String) {
        let s = try secret()
        defer { s.bytes.wipe() }
        return try container.unlock(s)
    }

    /// A password, from the given source or a no-echo prompt (asked twice when `confirm`).
    func password(prompt: String, confirm: Bool) throws -> SecureBytes {
        if let fd = secretFD { return try SecretReader.readAll(fd: fd, what: "the secret pipe") }
        return try password.password(prompt: prompt, confirm: confirm)
    }
}

enum SecretReader {
    static let maxLength = 4096

    static func fail(_ message: String) -> CLIFailure { CLIFailure(message: message, code: ExitStatus.badPasswordInput) }

    static func firstLine(ofFile path: String) throws -> SecureBytes {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw fail("cannot read password file \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        return try firstLine(fd: fd, what: "password file \(path)")
    }

    /// Runs the command without putting the password anywhere but its stdout pipe.
    static func firstLine(ofCommand command: String) throws -> SecureBytes {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw fail("cannot run --extpass command: pipe: \(String(cString: strerror(errno)))") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        defer { close(fds[0]) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // A terminal stays the command's stdin (systemd-ask-password and pinentry prompt on it), and the
        // command stays in our process group, so that it may set the terminal's modes (Foundation's
        // Process puts it in a group of its own, which the terminal stops with SIGTTOU). Anything that
        // is not a terminal is not the command's to read.
        if isatty(0) == 0 { posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0) }
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_addclose(&actions, fds[1])
        let argv: [UnsafeMutablePointer<CChar>?] = ([String](["/bin/sh", "-c", command])).map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/bin/sh", &actions, nil, argv, environ)
        close(fds[1])
        guard rc == 0 else { throw fail("cannot run --extpass command: \(String(cString: strerror(rc)))") }
        let secret: SecureBytes
        do { secret = try firstLine(fd: fds[0], what: "the --extpass command") } catch {
            // A command that failed says so by its status, whatever it printed.
            let status = drainAndWait(fds[0], pid)
            if status != 0 { throw fail("--extpass command failed with status \(status)") }
            throw error
        }
        let status = drainAndWait(fds[0], pid)
        guard status == 0 else {
            secret.wipe()
            throw fail("--extpass command failed with status \(status)")
        }
        return secret
    }

    /// Drains the rest of the command's output (so it does not block on a full pipe) and reaps it.
    @discardableResult
    private static func drainAndWait(_ fd: Int32, _ pid: pid_t) -> Int32 {
        var sink = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fd, &sink, sink.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
        }
        var st: Int32 = 0
        while waitpid(pid, &st, 0) < 0 && errno == EINTR {}
        return (st & 0x7f) == 0 ? (st >> 8) & 0xff : 128 + (st & 0x7f)
    }

    /// Reads up to the first newline into locked memory.
    static func firstLine(fd: Int32, what: String) throws -> SecureBytes {
        let buffer = SecureBytes(count: maxLength)
        var length = 0
        var byte: UInt8 = 0
        while true {
            let n = read(fd, &byte, 1)
            if n < 0 {
                if errno == EINTR { continue }
                throw fail("cannot read \(what): \(String(cString: strerror(errno)))")
            }
            if n == 0 || byte == UInt8(ascii: "\n") { break }
            guard length < maxLength else { throw fail("\(what): password longer than \(maxLength) bytes") }
            buffer.withUnsafeMutableBytes { $0[length] = byte }
            length += 1
        }
        byte = 0
        if length > 0, buffer.withUnsafeBytes({ $0[length - 1] }) == UInt8(ascii: "\r") { length -= 1 }
        guard length > 0 else { throw fail("\(what) gave an empty password") }
        let result = buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
        buffer.wipe()
        return result
    }

    static func readAll(fd: Int32, what: String) throws -> SecureBytes {
        let buffer = SecureBytes(count: maxLength)
        var length = 0
        while length < maxLength {
            let n = buffer.withUnsafeMutableBytes { b -> Int in
                guard let base = b.baseAddress else { return -1 }
                return read(fd, base + length, maxLength - length)
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw fail("cannot read \(what)")
            }
            if n == 0 { break }
            length += n
        }
        close(fd)
        guard length > 0 else { throw fail("\(what) gave an empty secret") }
        let result = buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
        buffer.wipe()
        return result
    }

    static func keyFile(_ path: String) throws -> SecureBytes {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw fail("cannot read key file \(path): \(String(cString: strerror(errno)))") }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_size > 0, st.st_size <= maxLength else {
            close(fd)
            throw fail("key file \(path) must hold 1 to \(maxLength) bytes")
        }
        return try readAll(fd: fd, what: "key file \(path)")
    }

    /// No-echo prompt on the controlling terminal.
    static func prompt(_ text: String, confirm: Bool) throws -> SecureBytes {
        let tty = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard tty >= 0, isatty(tty) != 0 else {
            throw fail("no password source: not on a terminal; use --passfile FILE or --extpass CMD")
        }
        defer { close(tty) }
        func ask(_ p: String) throws -> SecureBytes {
            _ = p.withCString { Glibc.write(tty, $0, strlen($0)) }
            var old = termios()
            tcgetattr(tty, &old)
            var quiet = old
            quiet.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(tty, TCSAFLUSH, &quiet)
            defer {
                tcsetattr(tty, TCSAFLUSH, &old)
                _ = Glibc.write(tty, "\n", 1)
            }
            return try firstLine(fd: tty, what: "the terminal")
        }
        let first = try ask(text)
        if confirm {
            let second = try ask("Repeat: ")
            defer { second.wipe() }
            guard first.constantTimeEquals(second) else {
                first.wipe()
                throw fail("the passwords do not match")
            }
        }
        return first
    }
}
