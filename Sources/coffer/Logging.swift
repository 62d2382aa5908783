import Foundation
import Glibc
import Logging

/// Logs go to stderr (the journal under systemd) or, for a daemon in the background, to syslog.
/// Nothing secret is ever logged; file names only at debug level.
enum Logging {
    static func makeLogger(level: String, toSyslog: Bool) -> Logger {
        let lvl = Logger.Level(rawValue: level.lowercased()) ?? .info
        LoggingSystem.bootstrap { label in
            var h: LogHandler = toSyslog ? SyslogLogHandler() : StreamLogHandler.standardError(label: label)
            h.logLevel = lvl
            return h
        }
        var logger = Logger(label: "coffer")
        logger.logLevel = lvl
        return logger
    }
}

struct SyslogLogHandler: LogHandler {
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    init() { openlog("coffer", LOG_PID, LOG_DAEMON) }

    func log(event: LogEvent) {
        let priority: Int32
        switch event.level {
        case .trace, .debug: priority = LOG_DEBUG
        case .info, .notice: priority = LOG_INFO
        case .warning: priority = LOG_WARNING
        case .error: priority = LOG_ERR
        case .critical: priority = LOG_CRIT
        }
        let text = "\(event.message)"
        text.withCString { message in
            withVaList([message]) { vsyslog(priority, "%s", $0) }
        }
    }
}
