import CofferStore
import Foundation

/// Sealed chunks fetched ahead of a program reading a file in order, on mounts whose store is a server
/// (PostgreSQL): there every READ the kernel sends (128 KiB) would wait for a round trip and for the
/// server to read its rows, one after the other. Once a file is read on from where its last read ended,
/// the next `window` chunks are fetched in the background, in `parts` on connections of their own, so
/// the server reads them (on another core) while the program takes the ones before.
///
/// Nothing here is trusted: a chunk is used only when its tag is the one the file's chunk map names at
/// the read (`CofferFileSystem.readRange`), so a chunk changed since it was fetched (here or on another
/// mount) is a miss, read from the store as any other. Chunks are taken once (the kernel keeps the pages);
/// at most `limit` bytes are held, the oldest dropped first.
final class ReadAhead: @unchecked Sendable {
    private struct Key: Hashable {
        let content: UInt64, index: UInt64
    }
    /// Where a file's reader is: the chunk after its last read, and how far fetches were started.
    private struct Stream {
        var next: UInt64
        var fetchedTo: UInt64
    }
    private let condition = NSCondition()
    private var chunks: [Key: [UInt8]] = [:]
    /// Keys in the order they came, for dropping the oldest (some may be taken already).
    private var arrival: [Key] = []
    private var arrivalHead = 0
    private var bytes = 0
    private var streams: [UInt64: Stream] = [:]
    /// Fetches running, by file: the ranges they will bring.
    private var running: [UInt64: [ClosedRange<UInt64>]] = [:]
    private var runningCount = 0
    private let fetch: @Sendable (UInt64, UInt64, UInt64) -> [(index: UInt64, sealed: [UInt8])]?
    /// Fetches started and chunks handed out so far (tests).
    private(set) var fetches = 0
    private(set) var chunksTaken = 0

    /// 32 chunks (1 MiB of 32 KiB chunks) ahead of the reader, fetched as two halves at once.
    static let window: UInt64 = 32
    static let parts: UInt64 = 2
    /// At most this many fetches at once over all files (the store's reader pool has four connections).
    static let maxRunning = 2
    static let limit = 16 << 20
    /// Bytes held now (tests).
    var heldBytes: Int {
        condition.lock()
        defer { condition.unlock() }
        return bytes
    }
    /// Waits until no fetch runs (tests).
    func settle() {
        condition.lock()
        defer { condition.unlock() }
        while runningCount > 0 { condition.wait() }
    }
    /// Files whose reader position is kept; more are forgotten all at once (a new stream starts over).
    static let maxStreams = 1024

    /// `fetch(content, first, last)`: the sealed chunks as committed, nil or empty when none can be had.
    init(fetch: @escaping @Sendable (UInt64, UInt64, UInt64) -> [(index: UInt64, sealed: [UInt8])]?) {
        self.fetch = fetch
    }

    /// Takes the held chunks `first...last` of `content`, first waiting for a running fetch that brings
    /// any of them. Indices not returned were not fetched (holes, or not ahead of the reader).
    func take(content: UInt64, first: UInt64, last: UInt64) -> [UInt64: [UInt8]] {
        condition.lock()
        defer { condition.unlock() }
        while running[content]?.contains(where: { $0.overlaps(first...last) }) == true { condition.wait() }
        var taken: [UInt64: [UInt8]] = [:]
        guard !chunks.isEmpty else { return taken }
        for index in first...last {
            if let sealed = chunks.removeValue(forKey: Key(content: content, index: index)) {
                bytes -= sealed.count
                taken[index] = sealed
                chunksTaken += 1
            }
        }
        return taken
    }

    /// Notes that chunks `first...last` of a file of `count` chunks were just read; when the read went on
    /// from where the last one ended, starts fetching what the reader will want next.
    func didRead(content: UInt64, first: UInt64, last: UInt64, count: UInt64) {
        condition.lock()
        defer { condition.unlock() }
        if streams.count >= Self.maxStreams, streams[content] == nil { streams.removeAll() }
        var stream = streams[content] ?? Stream(next: .max, fetchedTo: 0)
        let inOrder = stream.next == first
        stream.next = last + 1
        defer { streams[content] = stream }
        guard inOrder, last + 1 < count else { return }
        stream.fetchedTo = max(stream.fetchedTo, last + 1)
        let part = Self.window / Self.parts
        // Keep a window ahead: start parts while less than a window is fetched or coming.
        while stream.fetchedTo < min(count, last + 1 + Self.window), runningCount < Self.maxRunning, bytes < Self.limit {
            let range = stream.fetchedTo...min(count - 1, stream.fetchedTo + part - 1)
            stream.fetchedTo = range.upperBound + 1
            start(content: content, range: range)
        }
    }

    /// Runs one fetch on a thread of the system's pool. Under `condition`.
    private func start(content: UInt64, range: ClosedRange<UInt64>) {
        running[content, default: []].append(range)
        runningCount += 1
        fetches += 1
        DispatchQueue.global(qos: .userInitiated).async { [self] in
            let fetched = fetch(content, range.lowerBound, range.upperBound) ?? []
            condition.lock()
            defer {
                condition.broadcast()
                condition.unlock()
            }
            if let i = running[content]?.firstIndex(of: range) { running[content]?.remove(at: i) }
            if running[content]?.isEmpty == true { running[content] = nil }
            runningCount -= 1
            for (index, sealed) in fetched where range.contains(index) { keep(Key(content: content, index: index), sealed) }
        }
    }

    /// Holds a fetched chunk, dropping the oldest held ones beyond `limit`. Under `condition`.
    private func keep(_ key: Key, _ sealed: [UInt8]) {
        if let old = chunks.updateValue(sealed, forKey: key) { bytes -= old.count }
        bytes += sealed.count
        arrival.append(key)
        while bytes > Self.limit, arrivalHead < arrival.count {
            if let dropped = chunks.removeValue(forKey: arrival[arrivalHead]) { bytes -= dropped.count }
            arrivalHead += 1
        }
        // Taken chunks leave their keys behind: keep only those still held, now and then.
        if arrival.count - arrivalHead > 2 * chunks.count + 4096 {
            arrival = arrival[arrivalHead...].filter { chunks[$0] != nil }
            arrivalHead = 0
        }
    }
}
