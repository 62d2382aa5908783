/// A readdir position that needs no open directory: it names the last entry handed out by its tag.
///
/// Entries are listed in tag order (keyed HMACs of the names, so a stable order that reveals nothing). Cookies
/// 1 and 2 follow "." and ".."; an entry's cookie is 3 + (p << 8 | k), where p is the first 54 bits of its tag
/// and k counts the entries before it in tag order that share p (almost always 0: it takes some 2^27 entries in
/// one directory for even odds of one shared prefix). The kernel hands the cookie back as the offset of the
/// next READDIR, so a listing survives without OPENDIR and RELEASEDIR, and seekdir/telldir work.
struct DirectoryCookie: Equatable {
    static let afterDot: Int64 = 1
    static let afterDotDot: Int64 = 2
    static let prefixBits = 54

    /// The tag's first `prefixBits` bits.
    let prefix: UInt64
    /// Entries before this one (in tag order) with the same prefix; at most 255.
    let rank: UInt8

    init(prefix: UInt64, rank: UInt8) {
        self.prefix = prefix & ((1 << Self.prefixBits) - 1)
        self.rank = rank
    }

    /// The position an entry cookie names; nil for 0 ("from the start"), 1, 2, and negative offsets.
    init?(_ cookie: Int64) {
        guard cookie > Self.afterDotDot else { return nil }
        let v = UInt64(cookie - 3)
        self.init(prefix: v >> 8, rank: UInt8(truncatingIfNeeded: v))
    }

    /// Always positive, at most 2^62 + 2.
    var value: Int64 { 3 + Int64(prefix << 8 | UInt64(rank)) }

    static func prefix(of tag: [UInt8]) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<8 { v = v << 8 | UInt64(i < tag.count ? tag[i] : 0) }
        return v >> (64 - UInt64(prefixBits))
    }

    /// The smallest tag with this prefix, as 8 bytes: SQLite orders a blob after its own prefixes.
    var lowerBound: [UInt8] {
        let v = prefix << (64 - UInt64(Self.prefixBits))
        return (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) }
    }
}

/// Walks a directory's rows in tag order from a resume point's `lowerBound`, giving each row its cookie,
/// or nil for the rows of the resumed prefix that were handed out already (and for a 257th row sharing one
/// prefix, which no cookie can name).
struct ListingCursor {
    let resume: DirectoryCookie?
    private var last: DirectoryCookie?

    init(resume: DirectoryCookie?) { self.resume = resume }

    mutating func advance(tag: [UInt8]) -> DirectoryCookie? {
        let prefix = DirectoryCookie.prefix(of: tag)
        let rank = last.map { $0.prefix == prefix ? Int($0.rank) + 1 : 0 } ?? 0
        guard rank <= Int(UInt8.max) else { return nil }
        let here = DirectoryCookie(prefix: prefix, rank: UInt8(rank))
        last = here
        if let resume, prefix == resume.prefix, here.rank <= resume.rank { return nil }
        return here
    }
}
