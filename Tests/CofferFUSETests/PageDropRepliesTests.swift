import Glibc
import Testing

@testable import CofferFUSE

/// Which page a direct write has the kernel drop before its answer: the one holding the file's old end, when
/// that end is not on a page boundary and the write puts data in that page past it.
@Suite struct PageDropRepliesTests {
    @Test(arguments: [
        (4097, 4097, 4097, 4096),  // an append at the old end
        (4097, 5000, 100, 4096),  // past the old end, in its page: the page's zeros there are stale too
        (4097, 0, 8192, 4096),  // over the old end
        (10, 0, 4096, 0)  // an aligned write over an unaligned end
    ])
    func theOldEndsPageIsDropped(oldSize: Int, offset: Int, written: Int, page: Int) {
        #expect(PageDropReplies.stalePage(oldSize: UInt64(oldSize), offset: off_t(offset), written: written) == off_t(page))
    }

    @Test(arguments: [
        (4096, 4096, 4097),  // the old end on a boundary: no page holds zeros past it
        (0, 0, 4097),  // an empty file
        (4097, 8192, 10),  // wholly past the old end's page: never read
        (4097, 0, 100),  // wholly before the old end: the page held data there
        (4097, 100, 3997),  // ends at the old end
        (4097, 4097, 0)  // nothing written
    ])
    func noPageIsDropped(oldSize: Int, offset: Int, written: Int) {
        #expect(PageDropReplies.stalePage(oldSize: UInt64(oldSize), offset: off_t(offset), written: written) == nil)
    }
}
