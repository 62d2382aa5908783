/// Lowercase hex encoding and strict decoding, used across the project for IDs, tags and test vectors.
public extension Array where Element == UInt8 {
    /// Decodes an even-length string of hex digits (either case). Returns nil on any other character.
    init?(hex: String) {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = HexDigit.value(digits[index]), let low = HexDigit.value(digits[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        self = out
    }

    var hexString: String {
        var utf8: [UInt8] = []
        utf8.reserveCapacity(count * 2)
        for byte in self {
            utf8.append(HexDigit.alphabet[Int(byte >> 4)])
            utf8.append(HexDigit.alphabet[Int(byte & 0x0f)])
        }
        return String(decoding: utf8, as: UTF8.self)
    }
}

private enum HexDigit {
    static let alphabet: [UInt8] = Array("0123456789abcdef".utf8)

    static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
