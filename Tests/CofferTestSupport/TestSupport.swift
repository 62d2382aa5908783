import Foundation
import Testing

// Helpers every test target shares (one copy instead of one per target).
//
// Closures are kept out of #expect's arguments on purpose: with Swift 6.3, a closure literal inside
// #expect(...) next to another closure passed to the same helper in the same scope can run the wrong
// closure body (seen: the value of the previous closure was reported). These helpers take the closure
// as an ordinary trailing closure and record issues themselves.

public func b(_ s: String) -> [UInt8] { Array(s.utf8) }

/// Polls `condition` every `every` seconds for up to `seconds`; whether it came true.
@discardableResult
public func waitUntil(_ seconds: Double, every: Double = 0.02, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        Thread.sleep(forTimeInterval: every)
    }
    return condition()
}

public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

public func expectError<E: Error & Equatable, T>(
    _ expected: E, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> T
) {
    do {
        _ = try body()
        Issue.record("expected \(expected), nothing was thrown\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation)
    } catch let e as E {
        if e != expected { Issue.record("expected \(expected), got \(e)\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("expected \(expected), got \(type(of: error)): \(error)\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation)
    }
}

public func expectSomeError<E: Error, T>(
    _ type: E.Type, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> T
) {
    do {
        _ = try body()
        Issue.record("expected a \(E.self), nothing was thrown\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation)
    } catch is E {
    } catch {
        Issue.record("expected a \(E.self), got \(Swift.type(of: error)): \(error)", sourceLocation: sourceLocation)
    }
}

/// #require without a closure inside the macro (see the note above).
public func required<T>(_ value: T?, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation) throws -> T {
    guard let value else {
        Issue.record("required value is nil\(comment.map { ": \($0)" } ?? "")", sourceLocation: sourceLocation)
        throw TestFailure("required value is nil")
    }
    return value
}

/// SplitMix64: a tiny deterministic generator, so seeded fuzz and crash rounds can be replayed.
public struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    public mutating func bytes(_ n: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        var i = 0
        while i < n {
            var v = next()
            for _ in 0..<8 where i < n {
                out[i] = UInt8(truncatingIfNeeded: v)
                v >>= 8
                i += 1
            }
        }
        return out
    }
}

/// A call run on a thread of its own while the test goes on (a waiter for a lock, say): whether it has
/// returned yet, and what it threw.
public final class BackgroundCall: @unchecked Sendable {
    private let state = NSLock()
    private var finished = false
    private var error: (any Error)?

    public init(_ body: @escaping @Sendable () throws -> Void) {
        Thread { [self] in
            var thrown: (any Error)?
            do { try body() } catch { thrown = error }
            state.withLock { (finished, error) = (true, thrown) }
        }.start()
    }

    public var done: Bool { state.withLock { finished } }
    public var failure: (any Error)? { state.withLock { error } }
}
