import Foundation
import Glibc

/// A one-line progress bar with an ETA on stderr, drawn only when stderr is a terminal and the work
/// has already taken a moment (small containers finish before it would show).
final class ProgressBar {
    private let label: String
    private let enabled = isatty(STDERR_FILENO) != 0
    private let start = ContinuousClock.now
    private var lastDraw: ContinuousClock.Instant?
    private var drawn = false

    init(_ label: String) { self.label = label }

    func update(done: Int, total: Int) {
        guard enabled, total > 0 else { return }
        let now = ContinuousClock.now
        let elapsed = now - start
        guard elapsed > .milliseconds(300) else { return }
        if let lastDraw, now - lastDraw < .milliseconds(100), done < total { return }
        lastDraw = now
        let fraction = max(0, min(1, Double(done) / Double(total)))
        let width = 30
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        var eta = "--:--"
        if done > 0 {
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            let left = Int(seconds * Double(total - min(done, total)) / Double(done))
            eta = String(format: "%d:%02d", left / 60, left % 60)
        }
        let line = "\r\(label) [\(bar)] \(Int(fraction * 100))%  ETA \(eta) "
        FileHandle.standardError.write(Data(line.utf8))
        drawn = true
    }

    /// Clears the line so what follows starts clean.
    func finish() {
        guard drawn else { return }
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
        drawn = false
    }
}
