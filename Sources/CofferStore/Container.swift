import CofferCrypto
import Foundation
import Glibc

/// A container: a directory (the header file and the SQLite store beside it) or a schema in a
/// PostgreSQL database (the header row and the tables; `ContainerLocation`). Opening reads and checks
/// the header's structure; `unlock` turns a secret into the keys and authenticates the header.
public final class Container: @unchecked Sendable {
    /// Absolute path of the container root, as opened today; for PostgreSQL the URI without its
    /// password and parameters (what messages show).
    public let root: String
    /// Where the container lives (a directory's is its absolute path).
    public let location: ContainerLocation
    public private(set) var header: ContainerHeader
    /// The header's bytes as this process read or last wrote them: a rewrite goes ahead only while the
    /// stored header still is these (two `coffer passwd` at once: the second is refused, not lost).
    private var stored: Data?

    public var headerPath: String { root + "/" + ContainerHeader.fileName }
    public var containerId: [UInt8] { [UInt8](hex: header.containerId) ?? [] }

    /// The store file, resolved against today's root by the container-relative path transformer.
    public func storePath() throws(ContainerError) -> String {
        do { return try ContainerPathTransformer.resolveString(header.store, root: root) } catch {
            throw .headerDamaged("store path: \(error)")
        }
    }

    private init(root: String, header: ContainerHeader) {
        self.root = root
        self.location = .directory(root)
        self.header = header
    }

    private init(_ location: PostgresLocation, header: ContainerHeader) {
        self.root = location.display
        self.location = .postgres(location)
        self.header = header
    }

    // MARK: Opening

    /// Opens a container of either kind (`ContainerLocation.parse` of what the user typed).
    public static func open(_ location: ContainerLocation) throws(ContainerError) -> Container {
        switch location {
        case .directory(let path): return try open(at: path)
        case .postgres(let p):
            let data = try PostgresHeader.read(p)
            let c = Container(p, header: try decodeHeader(data))
            c.stored = data
            return c
        }
    }

    /// Whether other mounts (other machines) may use the container while this one does: a container in
    /// PostgreSQL (any number of mounts); a directory container has one mount at a time.
    public var isShared: Bool {
        if case .postgres = location { return true }
        return false
    }

    /// The container's entity store over its engine: the SQLite file beside the header, or the
    /// schema's tables. `reconnectWait`: how long a PostgreSQL store waits for a lost server.
    public func openStore(
        keys: ContainerKeys, registry: TransformerRegistry = .standard, readOnly: Bool = false,
        reconnectWait: Double = 30, leaseHolder: String? = nil, foreign: ForeignObjectPolicy = .refuse
    ) throws -> EntityStore {
        switch location {
        case .directory: return try EntityStore.open(at: try storePath(), keys: keys, registry: registry, readOnly: readOnly, foreign: foreign)
        case .postgres(let p):
            let backend = try PostgresBackend.open(p, readOnly: readOnly, reconnectWait: reconnectWait)
            backend.fenceHolder = leaseHolder
            // Mounts and fsck hold a lease; a mount shares the container with any number of others.
            backend.coherent = leaseHolder != nil && !readOnly
            return try EntityStore.open(backend, keys: keys, registry: registry)
        }
    }

    public static func open(at path: String) throws(ContainerError) -> Container {
        let root = absolutePath(path)
        var st = stat()
        guard stat(root, &st) == 0 else {
            if errno == ENOENT { throw .notFound(path) }
            throw .unreadable(path, String(cString: strerror(errno)))
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw .notADirectory(path) }
        let headerFile = root + "/" + ContainerHeader.fileName
        guard access(headerFile, F_OK) == 0 else {
            // A copy writes the header last: its store, under either name, without one is a copy under way.
            let stores = [SQLiteBackend.fileName, CopyDestination.newStoreName].map { root + "/" + $0 }
            if stores.contains(where: { access($0, F_OK) == 0 }) { throw .unfinishedCopy(path, orLostHeader: true) }
            throw .notAContainer(path)
        }
        guard let data = FileManager.default.contents(atPath: headerFile) else {
            throw .unreadable(path, "\(ContainerHeader.fileName): \(String(cString: strerror(errno)))")
        }
        let c = Container(root: root, header: try decodeHeader(data))
        c.stored = data
        return c
    }

    /// The header's JSON, checked for structure (the same bytes in either kind of container).
    static func decodeHeader(_ data: Data) throws(ContainerError) -> ContainerHeader {
        guard data.count <= 1 << 20 else { throw .headerDamaged("header file is too large") }
        let header: ContainerHeader
        do { header = try JSONDecoder().decode(ContainerHeader.self, from: data) } catch let e as DecodingError {
            throw .headerDamaged(Self.describe(e))
        } catch { throw .headerDamaged("not valid header JSON") }
        try checkStructure(header)
        return header
    }

    /// What is wrong with the header's JSON, naming the field ("slots[0].kdf.memoryKiB: ...").
    static func describe(_ e: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String {
            let text = keys.reduce("") { text, key in
                key.intValue.map { text + "[\($0)]" } ?? (text.isEmpty ? key.stringValue : text + "." + key.stringValue)
            }
            return text.isEmpty ? "the header" : text
        }
        switch e {
        case let .typeMismatch(type, c):
            let kind =
                type == String.self
                ? "a string"
                : type == Bool.self
                    ? "true or false"
                    : "\(type)".hasPrefix("Array")
                        ? "a list"
                        : "\(type)".hasPrefix("Dictionary") ? "an object" : "a number"
            return "\(path(c.codingPath)): not \(kind)"
        case let .valueNotFound(_, c): return "\(path(c.codingPath)): missing"
        case let .keyNotFound(key, c): return "\(path(c.codingPath + [key])): missing"
        case let .dataCorrupted(c):
            let why = c.debugDescription.unicodeScalars.filter { $0.properties.generalCategory != .control }.prefix(200)
            return c.codingPath.isEmpty ? "not valid header JSON" : "\(path(c.codingPath)): \(String(why))"
        @unknown default: return "not valid header JSON"
        }
    }

    /// Structural checks before any secret is used: a header that asks for something we do not
    /// know, or for a weaker KDF than the floor, is refused outright.
    static func checkStructure(_ h: ContainerHeader) throws(ContainerError) {
        guard h.format == ContainerHeader.formatName else { throw .headerDamaged("format is not \(ContainerHeader.formatName)") }
        guard h.version == ContainerHeader.currentVersion else { throw .unsupportedVersion(h.version) }
        guard h.cipher == ContainerHeader.supportedCipher else { throw .unsupportedCipher(h.cipher) }
        for f in h.features where !ContainerHeader.knownFeatures.contains(f) { throw .unsupportedFeature(f) }
        guard let id = [UInt8](hex: h.containerId), id.count == 16 else { throw .headerDamaged("container id") }
        guard [4096, 16384, 32768, 65536, 131072].contains(h.chunkSize) else { throw .headerDamaged("chunk size \(h.chunkSize)") }
        guard !h.slots.isEmpty else { throw .headerDamaged("no key slots") }
        for slot in h.slots {
            guard let sid = [UInt8](hex: slot.id), sid.count == 8 else { throw .headerDamaged("slot id") }
            // Checked here rather than found at unlock, where it would read as a wrong password.
            guard (Data(base64Encoded: slot.kdf.salt)?.count ?? 0) >= 16 else { throw .headerDamaged("kdf salt") }
            guard Data(base64Encoded: slot.wrappedKey)?.count == AESGCM.overhead + AESGCM.keySize else { throw .headerDamaged("wrapped key") }
            if slot.kind != .recovery {
                try kdfChoice(slot.kdf).validate()
            } else if slot.kdf.algorithm != "hkdf" {
                throw .headerDamaged("recovery slot kdf")
            }
        }
        guard Data(base64Encoded: h.mac)?.count == 32 else { throw .headerDamaged("mac") }
        // The store lies inside the container: a value that resolves anywhere else is damage (the MAC would
        // only say so after the secret).
        let probe = "/container"
        guard let store = try? ContainerPathTransformer.resolveString(h.store, root: probe), store.hasPrefix(probe + "/") else {
            throw .headerDamaged("store path")
        }
    }

    static func kdfChoice(_ k: KDFParameters) throws(ContainerError) -> KDFChoice {
        switch k.algorithm {
        case "argon2id":
            guard let t = k.iterations, let m = k.memoryKiB, let p = k.parallelism else { throw .headerDamaged("argon2id parameters") }
            return .argon2id(iterations: t, memoryKiB: m, parallelism: p)
        case "scrypt":
            guard let n = k.logN, let r = k.r, let p = k.p else { throw .headerDamaged("scrypt parameters") }
            return .scrypt(logN: n, r: r, p: p)
        default:
            throw .headerDamaged("unknown KDF \(k.algorithm)")
        }
    }

    // MARK: Unlocking

    /// Tries every slot that fits the secret's kind; the first that unwraps gives the master key,
    /// which must then authenticate the whole header. Returns the keys and the slot that matched.
    public func unlock(_ secret: Secret) throws(ContainerError) -> (keys: ContainerKeys, slotId: String) {
        let candidates = header.slots.filter { secret.fits($0.kind) }
        guard !candidates.isEmpty else { throw .noMatchingSlot }
        for slot in candidates {
            guard let master = try? unwrap(slot, secret: secret) else { continue }
            let keys: ContainerKeys
            do { keys = try ContainerKeys(master: master, containerId: containerId) } catch { throw .crypto("\(error)") }
            master.wipe()
            try verifyMAC(keys)
            return (keys, slot.id)
        }
        throw .wrongSecret
    }

    func verifyMAC(_ keys: ContainerKeys) throws(ContainerError) {
        guard let stored = Data(base64Encoded: header.mac), let bytes = try? header.canonicalBytes() else { throw .headerTampered }
        guard constantTimeEqual(keys.headerMAC.authenticate(bytes), [UInt8](stored)) else { throw .headerTampered }
    }

    private func unwrap(_ slot: KeySlot, secret: Secret) throws -> SecureBytes {
        guard let wrapped = Data(base64Encoded: slot.wrappedKey) else { throw ContainerError.headerDamaged("wrapped key") }
        let kek = try Self.keyEncryptionKey(slot.kdf, kind: slot.kind, secret: secret.bytes)
        let aead = try AESGCM(key: kek)
        kek.wipe()
        let opened = try aead.open([UInt8](wrapped), aad: Self.slotAAD(containerId: containerId, slot: slot))
        defer { _ = opened }  // plain array: keep its lifetime short
        guard opened.count == 32 else { throw ContainerError.headerDamaged("wrapped key length") }
        return SecureBytes(copying: opened)
    }

    static func slotAAD(containerId: [UInt8], slot: KeySlot) -> [UInt8] {
        Array("coffer/v1/slot".utf8) + containerId + ([UInt8](hex: slot.id) ?? []) + Array(slot.kind.rawValue.utf8)
    }

    static func keyEncryptionKey(_ kdf: KDFParameters, kind: KeySlot.Kind, secret: SecureBytes) throws -> SecureBytes {
        guard let salt = Data(base64Encoded: kdf.salt).map({ [UInt8]($0) }), salt.count >= 16 else {
            throw ContainerError.headerDamaged("kdf salt")
        }
        if kind == .recovery {
            return try HKDF.deriveKey(from: secret, salt: salt, info: Array("coffer/v1/recovery".utf8), count: 32)
        }
        switch try kdfChoice(kdf) {
        case let .argon2id(t, m, p):
            return try Argon2id.deriveKey(password: secret, salt: salt, iterations: t, memoryKiB: m, parallelism: p, count: 32)
        case let .scrypt(logN, r, p):
            return try Scrypt.deriveKey(password: secret, salt: salt, n: 1 << UInt64(logN), r: UInt64(r), p: UInt64(p), count: 32)
        }
    }

    // MARK: Creating

    public struct CreateOptions: Sendable {
        public var kdf: KDFChoice = .standard
        public var chunkSize: Int = 32768
        public var withRecoveryKey = true
        public init() {}
    }

    /// Creates a new container of either kind with one password slot (and a recovery slot unless
    /// asked not to). Returns the container, its keys and the recovery key text to show once.
    public static func create(_ location: ContainerLocation, password: SecureBytes, options: CreateOptions) throws(ContainerError)
        -> (container: Container, keys: ContainerKeys, recoveryKey: String?)
    {
        switch location {
        case .directory(let path): return try create(at: path, password: password, options: options)
        case .postgres(let p): return try create(p, password: password, options: options)
        }
    }

    /// Creates a new container directory with one password slot (and a recovery slot unless asked
    /// not to). Returns the container, its keys and the recovery key text to show once.
    public static func create(at path: String, password: SecureBytes, options: CreateOptions) throws(ContainerError)
        -> (container: Container, keys: ContainerKeys, recoveryKey: String?)
    {
        try options.kdf.validate()
        let root = absolutePath(path)
        var st = stat()
        var createdDirectory = false
        if stat(root, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFDIR else { throw .notADirectory(path) }
            let contents = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? ["?"]
            guard contents.isEmpty else { throw .alreadyExists(path) }
        } else {
            guard mkdir(root, 0o700) == 0 else { throw .io("\(path): cannot create: \(String(cString: strerror(errno)))") }
            createdDirectory = true
        }
        do {
            let (container, keys, recoveryText) = try newHeader(password: password, options: options) { Container(root: root, header: $0) }
            let storePath = try container.storePath()
            try EntityStore.create(at: storePath, keys: keys, registry: .standard, chunkSize: options.chunkSize)
            // Nothing in a container is for other users (SQLite gives its WAL and SHM the same mode).
            chmod(storePath, 0o600)
            try container.writeHeader(keys: keys)
            return (container, keys, recoveryText)
        } catch {
            if createdDirectory {
                try? FileManager.default.removeItem(atPath: root)
            } else {
                for f in (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [] {
                    try? FileManager.default.removeItem(atPath: root + "/" + f)
                }
            }
            if let e = error as? ContainerError { throw e }
            throw .io("cannot create the container: \(error)")
        }
    }

    /// A new container's keys and header with its slots (not written yet). The `store` field is
    /// `store.db` for either kind (PostgreSQL ignores it), so a header copies between engines as it is.
    private static func newHeader(password: SecureBytes, options: CreateOptions, make: (ContainerHeader) -> Container) throws
        -> (Container, ContainerKeys, String?)
    {
        let id = try Random.bytes(16)
        let master = try SecureBytes.random(count: 32)
        defer { master.wipe() }
        let keys = try ContainerKeys(master: master, containerId: id)
        let container = make(
            ContainerHeader(
                format: ContainerHeader.formatName, version: ContainerHeader.currentVersion,
                containerId: id.hexString, cipher: ContainerHeader.supportedCipher, chunkSize: options.chunkSize,
                store: SQLiteBackend.fileName, features: [], slots: [], mac: ""))
        container.header.slots.append(try container.makeSlot(kind: .password, secret: password, kdf: options.kdf, master: master, label: "password"))
        var recoveryText: String?
        if options.withRecoveryKey {
            let recovery = try SecureBytes.random(count: 32)
            defer { recovery.wipe() }
            container.header.slots.append(
                try container.makeSlot(kind: .recovery, secret: recovery, kdf: options.kdf, master: master, label: "recovery key"))
            recoveryText = RecoveryKey.format(recovery)
        }
        return (container, keys, recoveryText)
    }

    /// Whether a PostgreSQL container by that name exists (`coffer init` asks before the password;
    /// a server that cannot be reached throws `.unreachable`).
    public static func exists(_ location: PostgresLocation) throws(ContainerError) -> Bool { try PostgresHeader.exists(location) }

    /// A container in a new schema: the schema, its tables, the header row and the store's first
    /// rows in one transaction (all or nothing). A schema by that name already there is refused.
    private static func create(_ location: PostgresLocation, password: SecureBytes, options: CreateOptions) throws(ContainerError)
        -> (container: Container, keys: ContainerKeys, recoveryKey: String?)
    {
        try options.kdf.validate()
        guard try !PostgresHeader.exists(location) else { throw .alreadyExists(location.display) }
        do {
            let (container, keys, recoveryText) = try newHeader(password: password, options: options) { Container(location, header: $0) }
            let backend = try PostgresBackend.create(location, header: [UInt8](try container.authenticatedHeaderBytes(keys: keys)))
            defer { backend.close() }
            try EntityStore.initialize(backend, keys: keys, registry: .standard)
            return (container, keys, recoveryText)
        } catch let e as ContainerError { throw e } catch StoreError.unavailable(let why) {
            // The server went away mid-create: status 19, the user retries (a create that did commit before the
            // connection dropped is then refused as existing).
            throw .unreachable(location.display, why)
        } catch {
            throw .io("\(location.display): cannot create the container: \(error)")
        }
    }

    // MARK: Key slots

    func makeSlot(kind: KeySlot.Kind, secret: SecureBytes, kdf: KDFChoice, master: SecureBytes, label: String?, id: String? = nil) throws -> KeySlot {
        let salt = try Random.bytes(32)
        var params: KDFParameters
        switch kdf {
        case let .argon2id(t, m, p):
            params = KDFParameters(algorithm: "argon2id", salt: Data(salt).base64EncodedString(), iterations: t, memoryKiB: m, parallelism: p)
        case let .scrypt(logN, r, p):
            params = KDFParameters(algorithm: "scrypt", salt: Data(salt).base64EncodedString(), logN: logN, r: r, p: p)
        }
        if kind == .recovery { params = KDFParameters(algorithm: "hkdf", salt: Data(salt).base64EncodedString()) }
        var slot = KeySlot(id: try id ?? Random.bytes(8).hexString, kind: kind, label: label, kdf: params, wrappedKey: "")
        let kek = try Self.keyEncryptionKey(params, kind: kind, secret: secret)
        defer { kek.wipe() }
        let wrapped = try master.withUnsafeBytes { m in
            try Self.slotAAD(containerId: containerId, slot: slot).withUnsafeBytes { aad in try AESGCM(key: kek).seal(m, aad: aad) }
        }
        slot.wrappedKey = Data(wrapped).base64EncodedString()
        return slot
    }

    /// Adds a slot; the header is rewritten and re-authenticated. Returns the new slot's id.
    @discardableResult
    public func addSlot(kind: KeySlot.Kind, secret: SecureBytes, kdf: KDFChoice, label: String?, keys: ContainerKeys) throws(ContainerError) -> String
    {
        if kind != .recovery { try kdf.validate() }
        let master = keys.copyMaster()
        defer { master.wipe() }
        let slot: KeySlot
        do { slot = try makeSlot(kind: kind, secret: secret, kdf: kdf, master: master, label: label) } catch { throw .crypto("\(error)") }
        header.slots.append(slot)
        try writeHeader(keys: keys)
        return slot.id
    }

    /// Removes a slot; the last one is refused.
    public func removeSlot(id: String, keys: ContainerKeys) throws(ContainerError) {
        guard let i = header.slots.firstIndex(where: { $0.id == id }) else { throw .slotNotFound(id) }
        guard header.slots.count > 1 else { throw .lastSlot }
        header.slots.remove(at: i)
        try writeHeader(keys: keys)
    }

    /// Rewraps the master key under a new secret in place of slot `id` (a password change):
    /// no data is re-encrypted, and the old secret no longer opens that slot.
    public func replaceSlot(id: String, secret: SecureBytes, kdf: KDFChoice, keys: ContainerKeys) throws(ContainerError) {
        guard let i = header.slots.firstIndex(where: { $0.id == id }) else { throw .slotNotFound(id) }
        try kdf.validate()
        let master = keys.copyMaster()
        defer { master.wipe() }
        let old = header.slots[i]
        do {
            header.slots[i] = try makeSlot(kind: old.kind, secret: secret, kdf: kdf, master: master, label: old.label, id: old.id)
        } catch let e as ContainerError { throw e } catch { throw .crypto("\(error)") }
        try writeHeader(keys: keys)
    }

    /// Sets the header's MAC and returns the bytes to store (the same for either kind).
    private func authenticatedHeaderBytes(keys: ContainerKeys) throws -> Data {
        header.mac = ""
        header.mac = Data(keys.headerMAC.authenticate(try header.canonicalBytes())).base64EncodedString()
        return try header.fileBytes()
    }

    /// Authenticates and writes the header atomically: for a directory temp file, fsync, rename,
    /// fsync directory, under an flock of the header file (`lockHeaderFile`); in PostgreSQL one UPDATE
    /// of the header row.
    /// Either only if the stored header is still the one this process read (`stored`), else
    /// `headerChanged` and nothing written.
    func writeHeader(keys: ContainerKeys) throws(ContainerError) {
        do {
            let data = try authenticatedHeaderBytes(keys: keys)
            switch location {
            case .directory:
                // The first header (init) has nothing to compare with nor a file to lock.
                let held = stored == nil ? -1 : try lockHeaderFile()
                defer { if held >= 0 { close(held) } }  // and the lock with it
                if let stored, FileManager.default.contents(atPath: headerPath) != stored { throw ContainerError.headerChanged }
                try FileIO.writeAtomically(data, to: headerPath, mode: 0o600)
            case .postgres(let p): try PostgresHeader.write(data, replacing: stored, to: p)
            }
            stored = data
        } catch let e as ContainerError { throw e } catch {
            throw .io("cannot write \(ContainerHeader.fileName): \(error)")
        }
    }

    /// The header file, open and flock'ed (the directory's own flock is the mount's: `ContainerLock`).
    /// A rewrite replaces the file (rename), so the lock is good only on the file the name still
    /// names: taken again until it is. Waits 10 s at most for another rewrite.
    private func lockHeaderFile() throws(ContainerError) -> Int32 {
        let deadline = Date().addingTimeInterval(10)
        while true {
            let fd = Glibc.open(headerPath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { throw .io("cannot open \(headerPath): \(String(cString: strerror(errno)))") }
            if flock(fd, LOCK_EX | LOCK_NB) == 0 {
                var held = stat(), named = stat()
                if fstat(fd, &held) == 0, stat(headerPath, &named) == 0, held.st_ino == named.st_ino, held.st_dev == named.st_dev { return fd }
            }
            close(fd)
            guard Date() < deadline else { throw .io("\(headerPath) stays locked by another process rewriting it") }
            usleep(20_000)
        }
    }

    /// `path` made absolute against the working directory and standardized (no `.`, `..`, `//`).
    public static func absolutePath(_ path: String) -> String {
        var p = path
        if !p.hasPrefix("/") { p = FileManager.default.currentDirectoryPath + "/" + p }
        return (p as NSString).standardizingPath
    }
}

/// A secret offered to unlock a container.
public struct Secret: Sendable {
    public enum Kind: Sendable { case password, keyFile, recoveryKey }
    public let kind: Kind
    public let bytes: SecureBytes
    public init(kind: Kind, bytes: SecureBytes) {
        self.kind = kind
        self.bytes = bytes
    }

    /// A password that is really a recovery key (the printed form) unlocks recovery slots.
    public static func fromPassword(_ password: SecureBytes) -> Secret {
        if let rk = RecoveryKey.parse(password) { return Secret(kind: .recoveryKey, bytes: rk) }
        return Secret(kind: .password, bytes: password)
    }

    func fits(_ slot: KeySlot.Kind) -> Bool {
        switch (kind, slot) {
        case (.password, .password), (.keyFile, .keyfile), (.recoveryKey, .recovery): return true
        default: return false
        }
    }
}

/// The printed form of a recovery key: 64 hex digits in groups of 8.
public enum RecoveryKey {
    public static func format(_ key: SecureBytes) -> String {
        let hex = key.withUnsafeBytes { Array($0) }.hexString
        var groups: [String] = []
        var i = hex.startIndex
        while i < hex.endIndex {
            let j = hex.index(i, offsetBy: 8, limitedBy: hex.endIndex) ?? hex.endIndex
            groups.append(String(hex[i..<j]))
            i = j
        }
        return groups.joined(separator: "-")
    }

    static func parse(_ text: SecureBytes) -> SecureBytes? {
        text.withUnsafeBytes { raw -> SecureBytes? in
            var digits: [UInt8] = []
            digits.reserveCapacity(64)
            defer { for i in digits.indices { digits[i] = 0 } }
            for c in raw {
                switch c {
                case UInt8(ascii: "-"), UInt8(ascii: " "), UInt8(ascii: "\n"): continue
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digits.append(c - 48)
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digits.append(c - 87)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digits.append(c - 55)
                default: return nil
                }
            }
            guard digits.count == 64 else { return nil }
            let key = SecureBytes(count: 32)
            key.withUnsafeMutableBytes { k in for i in 0..<32 { k[i] = digits[2 * i] << 4 | digits[2 * i + 1] } }
            return key
        }
    }
}
