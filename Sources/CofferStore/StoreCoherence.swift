/// An engine whose store several mounts write at once (PostgreSQL; docs/FORMAT.md, "Several mounts
/// at once"). Every group transaction begins with the container's writer lock (exclusive, or shared
/// with the locks of the inodes it changes: `GroupScope`) and the sealed state read under it, so groups
/// that touch the same inodes run one after the other, and each commit's generation is one more than
/// the last; every commit is announced to the other mounts.
public protocol CoherentBackend: StoreBackend {
    /// Called at the start of every group transaction with the sealed state read under the writer
    /// lock (nil when the row is missing), and whether the engine reconnected to the server since the
    /// last group began: the server may then have crashed and lost this mount's commits that were not
    /// durable yet, even where other mounts' commits have since carried the generation past them.
    /// A throw ends the group before anything is written.
    var onGroupBegin: ((_ sealedState: [UInt8]?, _ reconnected: Bool) throws(StoreError) -> Void)? { get set }
    /// Called with the sealed state read inside an open group of inodes: under each further inode lock,
    /// and at its commit (`FOR UPDATE`). Other mounts commit beside such a group, so the generation
    /// only grows here; one that went back would be a server that lost commits under a live connection.
    var onStateInGroup: ((_ sealedState: [UInt8]?) throws(StoreError) -> Void)? { get set }
    /// Begins the group transaction now, if none is open: decisions made after this see every
    /// other mount's commits and no other mount commits until this group does. When another mount
    /// holds the lock, it is asked (a notification) to end its group, then waited for.
    func beginGroup() throws(StoreError)
    /// Makes the open group (begun here if none is) cover a change of `scope`: decisions made after this
    /// see every commit that touched what the scope names, and no other mount commits such a change
    /// until this group does. False: the open group is a `GroupScope.inode` one that cannot take it
    /// (the scope is the container, or another mount holds the inode); the caller commits it, then asks
    /// again, and the new group waits for what it needs (a group never waits while it holds inodes).
    func beginGroup(_ scope: GroupScope) throws(StoreError) -> Bool
    /// The open group holds the writer lock shared and only the inodes it locked (`GroupScope.inode`):
    /// other mounts commit beside it, and writes outside its inodes must wait for a group of their own.
    var holdsInodeGroup: Bool { get }
    /// Whether the open group may write rows of `inode`: any group of the container's, an inode group
    /// those of the inodes it locked or made (`madeInGroup`). A write outside them is refused (a lost
    /// update of another mount's change waiting to happen).
    func covers(_ inode: UInt64) -> Bool
    /// A new inode's id, taken in the open group: nobody else knows it before the commit, so it needs no lock.
    func madeInGroup(_ inode: UInt64)
    /// The sealed state as committed on the server once no other mount has a group open (close-to-
    /// open: what another mount closed may still be in its open group, which is asked to end, then
    /// waited for); one round trip when none is. Nil when a group of the container of this mount is
    /// open (nobody else can have committed since it began), or when this mount is alone (`isSole`).
    /// `inode`: and no group that changes it (an open of it, a listing or failed lookup in it); groups that
    /// changed other inodes only are not waited for. Nil: the container's groups only.
    func committedState(of inode: UInt64?) throws(StoreError) -> [UInt8]?
    /// No other mount held a lease when the open (or last) group began: this mount's groups may then
    /// stay open as long as a mount of its own keeps them (beside others they end sooner, so that
    /// listings elsewhere show the changes soon). A new mount first waits for every group open
    /// elsewhere (`beginGroup` then a commit that wrote nothing).
    var isAlone: Bool { get }
    /// No other mount has a lease, and one that comes waits until this mount knows (`join`): what is
    /// committed is what this mount committed, so `committedState` needs no round trip.
    var isSole: Bool { get }
    /// Sealed chunks `first...last` of a file as committed, for reading ahead of a reader (on a
    /// connection of their own, concurrently with other reads); nil when the file has changes in this
    /// mount's open group (those are read through the group).
    func committedChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [(index: UInt64, sealed: [UInt8])]?
    /// Announces a new mount and waits until every mount alone has heard it (`isSole` false there).
    /// Before this mount writes anything; afterwards it may become alone itself.
    func join() throws(StoreError)
    /// This mount's lease was taken again after it lapsed: it joins again before its next group.
    func rejoin()
    /// Another mount waits for the writer lock (it asked since this mount's last commit): a group open
    /// here should end soon, after a short slice for a reader (`readersWaiting`), once this mount
    /// pauses or its commit interval ends for a writer. Groups span several changes, on any number of
    /// mounts; this is what keeps one from holding the others up.
    var othersWaiting: Bool { get }
    /// ... and one of them waits to read (an open, opendir or failed lookup: close-to-open), which a
    /// busy group should not keep waiting longer than a slice.
    var readersWaiting: Bool { get }
    /// Starts hearing the other mounts (on a thread of the engine's): `heard` for each of their
    /// commits, and after a lost connection, when some may have gone unheard; then `changed` with the
    /// inodes those commits wrote, when they named them; `wanted` when one asks for the writer lock.
    func listen(heard: @escaping @Sendable () -> Void, changed: @escaping @Sendable ([UInt64]) -> Void, wanted: @escaping @Sendable () -> Void)
}

/// What a change decides on (docs/FORMAT.md, "Several mounts at once"): the group that runs it holds the
/// container's writer lock exclusively (`container`: links, removals, renames, whatever else touches rows
/// of several inodes) or shared, with a lock on each inode it changes (`inode`: a create or mkdir locks the
/// parent, a write, setattr or xattr change the file; `nothing`: an fsync). Groups of different inodes
/// run at the same time on different mounts; a container group waits for them all.
public enum GroupScope: Sendable, Equatable {
    case container
    case inode(UInt64)
    case nothing
}
