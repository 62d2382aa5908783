#ifndef COFFER_FUSE_RING_H
#define COFFER_FUSE_RING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/// FUSE over io_uring (Linux 6.14+, with the fuse module's `enable_uring` on): the kernel hands requests
/// to registered ring entries instead of queueing them on /dev/fuse, and a reply and the fetch of the
/// next request are one io_uring command. Each entry here has its own io_uring and its own thread, so a
/// request that blocks (an fsync waiting for a commit) holds up only its own entry; the kernel gives a
/// request to a free entry of the queue of the CPU its caller runs on.
///
/// FORGET and INTERRUPT, and every request before the rings are registered, still come through
/// /dev/fuse; so do notifications.

typedef struct coffer_ring coffer_ring;

/// Called on an entry's thread with one request laid out as read(2) from /dev/fuse would give it
/// (fuse_in_header, then the arguments); `length` is the whole. The buffer stays valid while the
/// handler runs, and after it returns until the request is answered; a reply written from the
/// handler's own thread overwrites the arguments (they share the payload buffer).
typedef void (*coffer_ring_handler)(void *context, void *request, size_t length);

/// Called once, for the first entry whose thread ends on an error (not at unmount or stop): `error` an errno,
/// `registering` nonzero when the kernel refused the registration (it then serves through /dev/fuse).
typedef void (*coffer_ring_failed)(void *context, int error, int registering);

/// Makes `per_queue` entries for each possible CPU on the FUSE connection `fuse_fd`, each with a payload
/// buffer of `payload_size` bytes (at least the connection's max_write and max_pages). Returns the rings,
/// or NULL with errno when they could not be made. Nothing runs yet: the caller first makes the rings
/// reachable by its reply path (a request may come the moment an entry is registered), then calls
/// coffer_ring_run.
coffer_ring *coffer_ring_start(int fuse_fd, unsigned per_queue, size_t payload_size,
                               coffer_ring_handler handler, coffer_ring_failed failed, void *context);

/// Starts the entries' threads, which register them. Returns 0, or an errno when a thread could not be
/// started (the others run). Registration is asynchronous: the kernel holds requests until every queue
/// has an entry (a failed registration reaches the handler).
int coffer_ring_run(coffer_ring *ring);

/// Sends a reply (fuse_out_header first, as written to /dev/fuse) to the entry that holds its request.
/// Returns the bytes taken, -1 when no entry holds that request (write it to /dev/fuse then), or -2
/// with errno when the reply could not be handed to its entry.
ssize_t coffer_ring_reply(coffer_ring *ring, const struct iovec *iov, int count);

/// Entries that have fetched requests since the start (0 while the kernel still uses /dev/fuse).
uint64_t coffer_ring_requests(coffer_ring *ring);

/// The first error an entry's command failed with (an errno; not ENOTCONN, which ends every entry at
/// unmount), or 0. An entry that failed no longer takes requests.
int coffer_ring_failure(coffer_ring *ring);

/// Stops the entries' threads (a reply left for an entry is sent first) and waits for them. Replies
/// after this find no thread to send them. Call when the session loop has stopped.
void coffer_ring_stop(coffer_ring *ring);

/// Stops the threads if running and frees the rings (closing an io_uring cancels its entries' commands).
/// No other thread may use `ring` any more.
void coffer_ring_free(coffer_ring *ring);

#endif
