import CofferStore
import Glibc

/// The background half of `rm`: deleting a removed file's rows (its chunks, map pages, xattrs and
/// inode) costs more than the unlink itself (SQLite walks each chunk's overflow pages), and at the
/// forget it made `rm -rf` wait. Under the committer (a mount), a forget moves a removed inode to
/// `dying`; the committer thread deletes the rows once no forget came for a moment, a piece at a time.
///
/// Crash safety: until its rows are gone a dying inode is written by every group commit with an
/// orphan row (`commitLocked`), so a crash leaves an orphan that the next mount removes. A piece
/// enters the store's writer before it takes its inodes off `dying`, so no commit falls between.
/// On a disk short of space, forgets delete at once as before, and commits reap everything first.
extension CofferFileSystem {
    /// Beyond this many dying inodes, forgets delete at once (memory stays bounded).
    static let maxDying = 65_536

    /// Deletes the rows of up to `limit` dying inodes in one visit to the writer. Returns how many;
    /// 0 also when `meta` was busy (it is only tried: everywhere else `meta` comes before the writer);
    /// -1 when the store failed (the inodes stay dying, and go out with orphan rows).
    @discardableResult
    func reapSome(_ limit: Int = 64) -> Int {
        guard !meta.withLock({ dying.isEmpty }) else { return 0 }
        var victims: [InodeState] = []
        do {
            try store.batch { () throws -> Void in
                // A removed file is no inode an open inode group holds: its rows wait for the next group.
                guard !store.holdsInodeGroup, meta.tryLock() else { return }
                // A dropped group may have taken the unlinks that made these files dying: after a lost
                // connection the reaper deleted the inode of a file that was back, fsynced content and
                // all, and left its entry dangling. The reload keeps only what the store holds unlinked.
                takeDroppedGroup()
                victims = Array(dying.values.prefix(limit))
                for s in victims {
                    dying[s.ino] = nil
                    forgetLosses(s.ino)
                }
                meta.unlock()
                for s in victims { try destroy(s, holdingMeta: false) }
            }
        } catch {
            // All back to dying, marked for the next commit's orphan row, and deleted again later (deletes
            // repeat harmlessly): a failed statement may have dropped the whole transaction, pieces done
            // before it included.
            meta.withLock {
                for s in victims {
                    s.deleted = false
                    s.dirty = true
                    dying[s.ino] = s
                }
            }
            logger.error("deleting removed files failed: \(error)")
            return -1
        }
        return victims.count
    }

    /// Called by the committer thread: reaps piece by piece while no forget arrives, so a running
    /// `rm -rf` is not slowed down by the deletes of the files it already removed.
    func reapIfQuiet() {
        let seen = forgetsSeen.load(ordering: .relaxed)
        defer { quietMark = seen }
        guard seen == quietMark else { return }
        while forgetsSeen.load(ordering: .relaxed) == seen, reapSome() > 0 {
            do { try commitIfDueOutsideChanges() } catch { logger.error("group commit failed: \(error)") }
        }
    }

    /// Reaps every dying inode (unmount, and before a commit on a disk short of space). Gives up on a
    /// store failure, or when `meta` stays busy for about 0.2 s: what is left goes out as orphans.
    func reapAll() {
        var busy = 0
        while busy < 200 {
            let n = reapSome(256)
            if n < 0 { return }
            if n > 0 {
                busy = 0
                continue
            }
            if meta.withLock({ dying.isEmpty }) { return }
            busy += 1
            usleep(1_000)
        }
    }
}
