import Foundation

// A background mount daemon keeps nothing of its launcher's but the pipes it was given.
Daemonizer.closeInheritedDescriptors(CommandLine.arguments)

// mount.fuse3 runs `coffer SOURCE MOUNTPOINT -o OPTS` for `mount -t fuse.coffer` and fstab lines:
// that argv form means `coffer mount SOURCE MOUNTPOINT -o OPTS`.
var arguments = Array(CommandLine.arguments.dropFirst())
if let first = arguments.first, !first.hasPrefix("-"), !CofferCommand.subcommandNames.contains(first) {
    arguments.insert("mount", at: 0)
}
CofferCommand.main(arguments)
