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
            if toSyslog { h = SyslogLogHandler() } else if journal { h = JournalLogHandler() } else { h = StreamLogHandler.standardError(label: label) }
            h.logLevel = lvl
            return h
        }
        var logger = Logger(label: "coffer")
        logger.logLevel = lvl
        return logger
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

struct JournalLogHandler: LogHandler {
    var logLevel: Logger.Level = .notice
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var text = "\(event.message)"
        let extra = (event.metadata ?? [:]).merging(metadata) { a, _ in a }
        if !extra.isEmpty { text += " " + extra.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
        let line = "<\(Logging.priority(event.level))>" + text.replacingOccurrences(of: "\n", with: " ") + "\n"
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
        let text = "\(event.message)"
        text.withCString { message in
            withVaList([message]) { vsyslog(Logging.priority(event.level), "%s", $0) }
        }
    }
}
