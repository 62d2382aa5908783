import Foundation
import Glibc
import Logging

/// Logs go to stderr (the journal under systemd) or, for a daemon in the background, to syslog.
/// Nothing secret is ever logged; names of files inside a mount only at debug level and below.
/// At the default level (notice) a mount says one line each for mounted, refused and unmounted.
enum Logging {
    static let levels = ["trace", "debug", "info", "notice", "warning", "error"]
    static let defaultLevel = "notice"

    static func makeLogger(level: String, toSyslog: Bool) -> Logger {
        let lvl = Logger.Level(rawValue: level.lowercased()) ?? .notice
        let journal = JournalStream.isStandardError()
        LoggingSystem.bootstrap { label in
            var h: LogHandler
            if toSyslog { h = SyslogLogHandler() } else if journal { h = JournalLogHandler() } else { h = StderrLogHandler() }
            h.logLevel = lvl
            return h
        }
        var logger = Logger(label: "coffer")
        logger.logLevel = lvl
        return logger
    }

    /// A damaged entity is met again at every read of it (the kernel retries, readahead): the same
    /// warning or error is said once per mount, so the log keeps one clear line per problem.
    static let repeats = RepeatFilter()

    /// The message with its metadata, on one line.
    static func text(_ event: LogEvent, _ handlerMetadata: Logger.Metadata) -> String {
        var text = "\(event.message)"
        let extra = (event.metadata ?? [:]).merging(handlerMetadata) { a, _ in a }
        if !extra.isEmpty { text += " " + extra.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
        return text.replacingOccurrences(of: "\n", with: " ")
    }

    /// syslog(3) priorities, which the journal also reads from a `<N>` line prefix.
    static func priority(_ level: Logger.Level) -> Int32 {
        switch level {
        case .trace, .debug: return LOG_DEBUG
        case .info: return LOG_INFO
        case .notice: return LOG_NOTICE
        case .warning: return LOG_WARNING
        case .error: return LOG_ERR
        case .critical: return LOG_CRIT
        }
    }
}

/// systemd sets JOURNAL_STREAM=DEV:INODE for a service whose stderr is the journal; only then do we
/// write its `<N>` prefixes (elsewhere they would be noise), and the journal adds time and unit itself.
enum JournalStream {
    static func isStandardError() -> Bool {
        guard let value = ProcessInfo.processInfo.environment["JOURNAL_STREAM"] else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return UInt64(st.st_dev) == dev && UInt64(st.st_ino) == ino
    }
}

final class RepeatFilter: @unchecked Sendable {
    private let lock = NSLock()
    private var seen: Set<String> = []

    /// False for a warning or error already logged (up to 4096 remembered); lower levels always pass.
    func admits(_ level: Logger.Level, _ text: String) -> Bool {
        guard level >= .warning else { return true }
        lock.lock(); defer { lock.unlock() }
        if seen.contains(text) { return false }
        if seen.count >= 4096 { seen.removeAll() }
        seen.insert(text)
        return true
    }
}

/// A terminal or a file: time, level, message.
struct StderrLogHandler: LogHandler {
    var logLevel: Logger.Level = .notice
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let text = Logging.text(event, metadata)
        guard Logging.repeats.admits(event.level, text) else { return }
        let time = ISO8601DateFormatter().string(from: Date())
        FileHandle.standardError.write(Data("\(time) \(event.level) coffer: \(text)\n".utf8))
    }
}

struct JournalLogHandler: LogHandler {
    var logLevel: Logger.Level = .notice
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let text = Logging.text(event, metadata)
        guard Logging.repeats.admits(event.level, text) else { return }
        let line = "<\(Logging.priority(event.level))>" + text + "\n"
        FileHandle.standardError.write(Data(line.utf8))
    }
}

struct SyslogLogHandler: LogHandler {
    var logLevel: Logger.Level = .notice
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    init() { openlog("coffer", LOG_PID, LOG_DAEMON) }

    func log(event: LogEvent) {
        let text = Logging.text(event, metadata)
        guard Logging.repeats.admits(event.level, text) else { return }
        text.withCString { message in
            withVaList([message]) { vsyslog(Logging.priority(event.level), "%s", $0) }
        }
    }
}
