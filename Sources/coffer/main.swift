import Foundation
import Glibc

// Keys live in this process: a crash must not write them to disk in a core dump (SecureBytes are
// also MADV_DONTDUMP; OpenSSL's key schedules are not).
var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
_ = setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &noCore)

// A background mount daemon keeps nothing of its launcher's but the pipes it was given, and no path it
// inherited relative to the launcher's directory (it leaves that directory once it serves).
Daemonizer.closeInheritedDescriptors(CommandLine.arguments)
Daemonizer.makeInheritedPathsAbsolute(CommandLine.arguments)

let arguments = CommandRouting.route(Array(CommandLine.arguments.dropFirst()))
// fsck's usage errors exit 16 as fsck(8)'s do.
if arguments.first == "fsck" { FsckCommand.main(mappingUsageErrors: arguments) }
CofferCommand.main(arguments)
