import ArgumentParser
import CofferStore

/// Key-derivation cost, for init and for new key slots.
struct KDFOptions: ParsableArguments {
    enum Algorithm: String, ExpressibleByArgument, CaseIterable { case argon2id, scrypt }

    @Option(help: "Key derivation function.")
    var kdf: Algorithm = .argon2id

    @Option(help: "Argon2id passes (at least 2).")
    var argon2Iterations: UInt32 = 3

    @Option(help: "Argon2id memory in MiB (at least 64).")
    var argon2Memory: UInt32 = 128

    @Option(help: "Argon2id lanes.")
    var argon2Parallelism: UInt32 = 2

    @Option(name: .customLong("scrypt-logn"), help: "scrypt cost as log2(N) (at least 16).")
    var scryptLogN: UInt8 = 17

    var choice: KDFChoice {
        switch kdf {
        case .argon2id: return .argon2id(iterations: argon2Iterations, memoryKiB: argon2Memory * 1024, parallelism: argon2Parallelism)
        case .scrypt: return .scrypt(logN: scryptLogN, r: 8, p: 1)
        }
    }

    func validate() throws {
        do { try choice.validate() } catch { throw ValidationError(error.description) }
    }
}
