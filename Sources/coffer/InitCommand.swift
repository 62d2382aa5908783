import ArgumentParser
import CofferStore
import Foundation
import Glibc

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init", abstract: "Create a new container (a directory, or a schema in PostgreSQL named by a postgresql:// URI).")

    @Argument(help: "The container directory to create (missing or empty), or a postgresql://...?container=NAME URI.")
    var container: String

    @OptionGroup var secret: PasswordSource
    @OptionGroup var kdf: KDFOptions

    @Option(help: "Content chunk size in bytes (4096, 16384, 32768, 65536 or 131072).")
    var chunkSize: Int = 32768

    @Flag(help: "Do not create and print a recovery key.")
    var noRecoveryKey = false

    func validate() throws {
        guard [4096, 16384, 32768, 65536, 131072].contains(chunkSize) else { throw ValidationError("unsupported --chunk-size \(chunkSize)") }
        if secret.passfile != nil, secret.extpass != nil { throw ValidationError("give only one of --passfile, --extpass") }
    }

    /// Refuses a place where no container can be created before the password is asked.
    func checkTarget() throws {
        if case .postgres(let p) = try ContainerSource.location(container) {
            guard try !Container.exists(p) else { throw ContainerError.alreadyExists(p.display) }
            return
        }
        let path = Container.absolutePath(container)
        var st = stat()
        if stat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFDIR else { throw ContainerError.notADirectory(container) }
            guard (try? FileManager.default.contentsOfDirectory(atPath: path))?.isEmpty == true else { throw ContainerError.alreadyExists(container) }
        } else {
            let parent = (path as NSString).deletingLastPathComponent
            guard access(parent, W_OK) == 0 else {
                throw CLIFailure(
                    message: "\(container): cannot create it in \(parent): \(String(cString: strerror(errno)))", code: ExitStatus.noContainer)
            }
        }
    }

    func run() throws {
        try reportingFailures {
            try checkTarget()
            let password = try secret.password(prompt: "New password: ", confirm: true)
            defer { password.wipe() }
            var options = Container.CreateOptions()
            options.kdf = kdf.choice
            options.chunkSize = chunkSize
            options.withRecoveryKey = !noRecoveryKey
            let created = try Container.create(try ContainerSource.location(container), password: password, options: options)
            defer { created.keys.wipe() }
            print("Created container \(created.container.root)")
            print("  key derivation: \(kdf.choice)")
            if let recovery = created.recoveryKey {
                print(
                    """

                    Recovery key (shown only now; it opens the container without the password, so keep it
                    somewhere safe and offline; give it wherever a password is asked):

                        \(recovery)

                    """)
            }
        }
    }
}
