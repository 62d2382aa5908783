import CofferCrypto

/// Hex literal for test vectors; an invalid literal yields an empty array, which then fails the comparison.
func h(_ hex: String) -> [UInt8] {
    [UInt8](hex: hex.filter { !$0.isWhitespace }) ?? []
}

func bytes(_ string: String) -> [UInt8] { Array(string.utf8) }
