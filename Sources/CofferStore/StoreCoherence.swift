/// An engine whose store several mounts write at once (PostgreSQL; docs/FORMAT.md, "Several mounts
/// at once"). Every group transaction begins with the container's writer lock and the sealed state
/// read under it, so groups of all mounts run one after the other and each commit's generation is
/// one more than the last; every commit is announced to the other mounts.
public protocol CoherentBackend: StoreBackend {
    /// Called at the start of every group transaction with the sealed state read under the writer
    /// lock (nil when the row is missing), and whether the engine reconnected to the server since the
    /// last group began: the server may then have crashed and lost this mount's commits that were not
    /// durable yet, even where other mounts' commits have since carried the generation past them.
    /// A throw ends the group before anything is written.
    var onGroupBegin: ((_ sealedState: [UInt8]?, _ reconnected: Bool) throws(StoreError) -> Void)? { get set }
    /// Begins the group transaction now, if none is open: decisions made after this see every
    /// other mount's commits and no other mount commits until this group does.
    func beginGroup() throws(StoreError)
    /// The sealed state as committed on the server now (one round trip, outside any transaction);
    /// nil when a group of this mount is open (nobody else can have committed since it began).
    func committedState() throws(StoreError) -> [UInt8]?
    /// No other mount held a lease when the open (or last) group began: this mount's groups may then
    /// span several changes, as a mount of its own does. A new mount first waits for every group open
    /// elsewhere (`beginGroup` then a commit that wrote nothing), so a group begun alone ends before
    /// the new mount reads anything (docs/FORMAT.md, "Several mounts at once").
    var isAlone: Bool { get }
    /// Starts hearing other mounts' commits: `heard` is called (on a thread of the engine's) for
    /// each, and after a lost connection, when some may have gone unheard.
    func listen(_ heard: @escaping @Sendable () -> Void)
}
