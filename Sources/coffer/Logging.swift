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
            var h = CofferLogHandler(toSyslog ? .syslog : journal ? .journal : .stderr)
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
        lock.lock()
        defer { lock.unlock() }
        if seen.contains(text) { return false }
        if seen.count >= 4096 { seen.removeAll() }
        seen.insert(text)
        return true
    }
}

/// One handler for the three places logs go; they differ only in how a line is written.
struct CofferLogHandler: LogHandler {
    enum Sink {
        /// A terminal or a file: time, level, message.
        case stderr
        /// The journal: a `<N>` priority prefix; the journal adds time and unit itself.
        case journal
        /// syslog(3), for a daemon in the background.
        case syslog
    }

    let sink: Sink
    var logLevel: Logger.Level = .notice
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    init(_ sink: Sink) {
        self.sink = sink
        if sink == .syslog { openlog("coffer", LOG_PID, LOG_DAEMON) }
    }

    func log(event: LogEvent) {
        let text = Logging.text(event, metadata)
        guard Logging.repeats.admits(event.level, text) else { return }
        switch sink {
        case .stderr:
            let time = Self.timestamp()
            FileHandle.standardError.write(Data("\(time) \(event.level) coffer: \(text)\n".utf8))
        case .journal:
            FileHandle.standardError.write(Data("<\(Logging.priority(event.level))>\(text)\n".utf8))
        case .syslog:
            text.withCString { message in
                withVaList([message]) { vsyslog(Logging.priority(event.level), "%s", $0) }
            }
        }
    }

    /// UTC, ISO 8601 to the second (strftime on a gmtime_r result: thread-safe, no formatter object).
    private static func timestamp() -> String {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let n = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%SZ", &parts)
        return String(decoding: buffer.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
