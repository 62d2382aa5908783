// FUSE over io_uring: one io_uring and one thread per ring entry (see include/fuse_ring.h).
// Wire structures from include/uapi/linux/fuse.h (7.42); Debian 12's headers predate them.
#define _GNU_SOURCE
#include "fuse_ring.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

enum { IN_HEADER = 40, OUT_HEADER = 16, OP_IN_MAX = 128 };
enum { CMD_REGISTER = 1, CMD_COMMIT_AND_FETCH = 2 };
/// How long an entry that just answered looks for the next request before it sleeps (spin_for_next).
#define SPIN_NS 50000

struct ring_ent_in_out {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};

struct ring_req_header {
    char in_out[128];  // fuse_in_header, then fuse_out_header
    char op_in[OP_IN_MAX];  // the opcode's own header (its first argument)
    struct ring_ent_in_out ent;
};

struct ring_cmd_req {
    uint64_t flags;
    uint64_t commit_id;
    uint16_t qid;
    uint8_t padding[6];
};

/// The user_data of the shutdown poll and of the reply poll; the entry's command uses its address.
#define STOP_TAG 1
#define KICK_TAG 2

struct entry {
    coffer_ring *owner;
    struct io_uring uring;
    int uring_ready;
    unsigned qid;
    struct ring_req_header *header;  // a page of its own
    char *area;                      // a page of headroom, then the payload
    size_t area_size;
    struct iovec iov[2];
    pthread_mutex_t submit;  // guards the submission queue (only the entry's thread submits; kept for safety)
    int last_cmd;
    uint64_t commit_id;
    _Atomic uint64_t unique;  // the request held, 0 when none
    /// io_uring cancels a command when the thread that submitted it exits, so only the entry's own thread
    /// submits: a reply from another thread sets `reply_ready` and writes `kick`, which the entry polls.
    int kick;
    _Atomic int reply_ready;
    /// Set by the entry's thread while its handler runs; `commit_due`: that handler replied.
    int in_handler;
    int commit_due;
    pthread_t thread;
    int thread_started;
};

struct coffer_ring {
    int fuse_fd;
    int stop_fd;
    size_t payload_size;
    coffer_ring_handler handler;
    coffer_ring_failed failed;
    void *context;
    unsigned count;
    _Atomic uint64_t requests;
    _Atomic int stopping;
    _Atomic int failure;  // the first error an entry's command ended with (not ENOTCONN)
    _Atomic int spinner;  // an entry is spinning for the next request (spin_for_next)
    int64_t spin_ns;
    /// Test switch (COFFER_TEST_RING_FAIL_AFTER=N): the entry that takes the Nth request handles it, then ends with
    /// EIO instead of committing the reply, as when the kernel refuses a commit: the work is done (a WRITE's bytes
    /// are stored) but its caller waits until the connection ends; 0: never.
    uint64_t fail_after;
    struct entry entries[];
};

static char *payload_of(struct entry *e) { return e->area + 4096; }

/// Queues the entry's next command (REGISTER or COMMIT_AND_FETCH) and submits it. Caller holds `submit`.
static int submit_locked(struct entry *e, int cmd) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->uring);
    if (!sqe) return -EBUSY;
    memset(sqe, 0, 128);
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = e->owner->fuse_fd;
    sqe->cmd_op = cmd;
    io_uring_sqe_set_data(sqe, e);
    struct ring_cmd_req *req = (struct ring_cmd_req *)sqe->cmd;
    req->qid = (uint16_t)e->qid;
    if (cmd == CMD_REGISTER) {
        sqe->addr = (uint64_t)(uintptr_t)e->iov;
        sqe->len = 2;
    } else {
        req->commit_id = e->commit_id;
    }
    e->last_cmd = cmd;
    int n = io_uring_submit(&e->uring);
    return n < 0 ? n : 0;
}

static int submit(struct entry *e, int cmd) {
    pthread_mutex_lock(&e->submit);
    int r = submit_locked(e, cmd);
    pthread_mutex_unlock(&e->submit);
    return r;
}

/// Lays the request out as /dev/fuse gives it: the in header and the opcode's header just before the
/// payload, which the kernel already wrote in place. Returns the start, or NULL if the sizes disagree.
static char *flatten(struct entry *e, size_t *length) {
    uint32_t len;
    memcpy(&len, e->header->in_out, 4);
    size_t payload = e->header->ent.payload_sz;
    if (payload > e->owner->payload_size || len < IN_HEADER + payload) return NULL;
    size_t op_in = len - IN_HEADER - payload;
    if (op_in > OP_IN_MAX) return NULL;
    char *start = payload_of(e) - IN_HEADER - op_in;
    memcpy(start, e->header->in_out, IN_HEADER);
    memcpy(start + IN_HEADER, e->header->op_in, op_in);
    *length = len;
    return start;
}

static int arm_kick(struct entry *e) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->uring);
    if (!sqe) return -EBUSY;
    io_uring_prep_poll_add(sqe, e->kick, POLLIN);
    io_uring_sqe_set_data(sqe, (void *)KICK_TAG);
    return 0;
}

static void answer_error(struct entry *e, uint64_t unique, int error) {
    uint32_t header[4] = {OUT_HEADER, (uint32_t)-error, 0, 0};
    memcpy(&header[2], &unique, 8);
    struct iovec iov = {header, sizeof header};
    coffer_ring_reply(e->owner, &iov, 1);
}

/// Sends a reply another thread left (`reply_ready`), re-arming the kick poll. Returns 0 or -errno.
static int send_left_reply(struct entry *e, int rearm) {
    pthread_mutex_lock(&e->submit);
    int r = rearm ? arm_kick(e) : 0;
    if (r == 0 && atomic_exchange(&e->reply_ready, 0)) r = submit_locked(e, CMD_COMMIT_AND_FETCH);
    else if (r == 0 && rearm) r = io_uring_submit(&e->uring) < 0 ? -EIO : 0;
    pthread_mutex_unlock(&e->submit);
    return r;
}

/// The entry's thread ends on `error` (-errno; not at unmount): the owner hears the first such end.
static void entry_failed(struct entry *e, int error, int registering) {
    coffer_ring *ring = e->owner;
    if (error == -ENOTCONN || error == -ECONNABORTED || atomic_load(&ring->stopping)) return;
    int none = 0;
    if (atomic_compare_exchange_strong(&ring->failure, &none, -error)) ring->failed(ring->context, -error, registering);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/// After answering a request, one entry at a time looks for the next one for a moment before it sleeps: the
/// kernel hands the next request of a serial client (tar, rm) to the entry that answered last (its queue's free
/// entries are taken newest first), and finding it awake saves the wake-up, which on a virtual machine costs
/// more than most requests (as RequestReader's spin on /dev/fuse). Returns 1 with a completion.
static int spin_for_next(struct entry *e, struct io_uring_cqe **cqe) {
    coffer_ring *ring = e->owner;
    int idle = 0;
    if (!atomic_compare_exchange_strong(&ring->spinner, &idle, 1)) return 0;
    int64_t end = now_ns() + ring->spin_ns;
    int found = 0;
    while (!found && now_ns() < end) {
        if (io_uring_peek_cqe(&e->uring, cqe) == 0) found = 1;
        else sched_yield();
    }
    atomic_store(&ring->spinner, 0);
    return found;
}

static void *entry_thread(void *arg) {
    struct entry *e = arg;
    coffer_ring *ring = e->owner;
    pthread_setname_np(pthread_self(), "coffer-ring");
    int r = submit(e, CMD_REGISTER);
    if (r < 0) {
        entry_failed(e, r, 1);
        return NULL;
    }
    int hot = 0;
    while (!atomic_load(&ring->stopping)) {
        struct io_uring_cqe *cqe = NULL;
        if (hot && ring->spin_ns > 0 && spin_for_next(e, &cqe)) r = 0;
        else r = io_uring_wait_cqe(&e->uring, &cqe);
        hot = 0;
        if (r == -EINTR) continue;
        if (r < 0) {
            entry_failed(e, r, 0);
            break;
        }
        void *data = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&e->uring, cqe);
        if (data == (void *)STOP_TAG) {
            send_left_reply(e, 0);  // a lock waiter's answer written just before the stop
            break;
        }
        if (data == (void *)KICK_TAG) {  // a reply written by another thread
            uint64_t n;
            ssize_t got = read(e->kick, &n, sizeof n);
            (void)got;
            r = send_left_reply(e, 1);
            if (r < 0) {
                entry_failed(e, r, 0);
                break;
            }
            continue;
        }
        if (res == -EAGAIN || res == -EINTR) {  // the connection was not initialized yet, or a signal
            if (res == -EAGAIN) usleep(1000);
            r = submit(e, e->last_cmd);
            if (r < 0) {
                entry_failed(e, r, e->last_cmd == CMD_REGISTER);
                break;
            }
            continue;
        }
        if (res < 0) {  // ENOTCONN: unmounted; anything else: this entry is done
            entry_failed(e, res, e->last_cmd == CMD_REGISTER);
            break;
        }
        int failing = atomic_fetch_add(&ring->requests, 1) + 1 == ring->fail_after;
        e->commit_id = e->header->ent.commit_id;
        uint64_t unique;
        memcpy(&unique, e->header->in_out + 8, 8);
        size_t length = 0;
        char *request = flatten(e, &length);
        atomic_store(&e->unique, unique);
        // A reply from this thread only fills the entry; its commit (which lets the kernel write the next
        // request over this one) waits until the handler has returned.
        e->in_handler = 1;
        if (!request) answer_error(e, unique, EIO);
        else ring->handler(ring->context, request, length);
        e->in_handler = 0;
        hot = 1;
        if (failing) {
            entry_failed(e, -EIO, 0);
            break;
        }
        if (e->commit_due) {
            e->commit_due = 0;
            r = submit(e, CMD_COMMIT_AND_FETCH);
            if (r < 0) {
                entry_failed(e, r, 0);
                break;
            }
        }
    }
    return NULL;
}

static void free_entry(struct entry *e) {
    if (e->uring_ready) io_uring_queue_exit(&e->uring);
    if (e->header) munmap(e->header, 4096);
    if (e->area) munmap(e->area, e->area_size);
    if (e->kick > 0) close(e->kick);
    pthread_mutex_destroy(&e->submit);
}

static int setup_entry(coffer_ring *ring, struct entry *e, unsigned qid) {
    e->owner = ring;
    e->qid = qid;
    pthread_mutex_init(&e->submit, NULL);
    struct io_uring_params params = {0};
    params.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
    params.cq_entries = 8;
    int r = io_uring_queue_init_params(4, &e->uring, &params);
    if (r < 0) return r;
    e->uring_ready = 1;
    void *h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) return -errno;
    e->header = h;
    e->area_size = 4096 + ((ring->payload_size + 4095) & ~(size_t)4095);
    void *a = mmap(NULL, e->area_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return -errno;
    e->area = a;
    e->iov[0] = (struct iovec){e->header, sizeof(struct ring_req_header)};
    e->iov[1] = (struct iovec){payload_of(e), ring->payload_size};
    // Woken at stop (a poll on the shared eventfd) and for replies from other threads (its own).
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->uring);
    if (!sqe) return -EBUSY;
    io_uring_prep_poll_add(sqe, ring->stop_fd, POLLIN);
    io_uring_sqe_set_data(sqe, (void *)STOP_TAG);
    e->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->kick < 0) return -errno;
    return arm_kick(e);
}

/// The kernel makes one queue per possible CPU (nr_cpu_ids): the highest number in
/// /sys/devices/system/cpu/possible ("0-1", "0-3,8-11"), plus one.
static long possible_cpus(void) {
    FILE *f = fopen("/sys/devices/system/cpu/possible", "re");
    if (!f) return sysconf(_SC_NPROCESSORS_CONF);
    char line[256] = {0};
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (!got) return sysconf(_SC_NPROCESSORS_CONF);
    long highest = -1, n = -1;
    for (char *c = line;; c++) {
        if (*c >= '0' && *c <= '9') {
            n = (n < 0 ? 0 : n * 10) + (*c - '0');
        } else {
            if (n > highest) highest = n;
            n = -1;
            if (*c == 0 || *c == '\n') break;
        }
    }
    return highest >= 0 ? highest + 1 : sysconf(_SC_NPROCESSORS_CONF);
}

coffer_ring *coffer_ring_start(int fuse_fd, unsigned per_queue, size_t payload_size,
                               coffer_ring_handler handler, coffer_ring_failed failed, void *context) {
    long cpus = possible_cpus();
    if (cpus < 1 || per_queue < 1) {
        errno = EINVAL;
        return NULL;
    }
    unsigned count = (unsigned)cpus * per_queue;
    coffer_ring *ring = calloc(1, sizeof(coffer_ring) + count * sizeof(struct entry));
    if (!ring) return NULL;
    ring->fuse_fd = fuse_fd;
    ring->payload_size = payload_size;
    ring->handler = handler;
    ring->failed = failed;
    ring->spin_ns = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? SPIN_NS : 0;  // with one processor the spinner would only keep the client from it
    ring->context = context;
    ring->count = count;
    const char *fail_after = getenv("COFFER_TEST_RING_FAIL_AFTER");
    ring->fail_after = fail_after ? strtoull(fail_after, NULL, 10) : 0;
    ring->stop_fd = eventfd(0, EFD_CLOEXEC);
    int err = ring->stop_fd < 0 ? errno : 0;
    unsigned made = 0;
    for (; err == 0 && made < count; made++) {
        int r = setup_entry(ring, &ring->entries[made], made / per_queue);
        if (r < 0) err = -r;
    }
    if (err) {
        ring->count = made;
        coffer_ring_free(ring);
        errno = err;
        return NULL;
    }
    return ring;
}

int coffer_ring_run(coffer_ring *ring) {
    for (unsigned i = 0; i < ring->count; i++) {
        struct entry *e = &ring->entries[i];
        if (pthread_create(&e->thread, NULL, entry_thread, e) != 0) return EAGAIN;
        e->thread_started = 1;
    }
    return 0;
}

ssize_t coffer_ring_reply(coffer_ring *ring, const struct iovec *iov, int count) {
    if (!ring || count < 1 || iov[0].iov_len < OUT_HEADER) return -1;
    uint64_t unique;
    memcpy(&unique, (const char *)iov[0].iov_base + 8, 8);
    if (unique == 0) return -1;
    // Claim the entry: a second reply to the same request (an interrupt racing a grant) finds none.
    struct entry *e = NULL;
    for (unsigned i = 0; i < ring->count; i++) {
        uint64_t held = unique;
        if (atomic_compare_exchange_strong(&ring->entries[i].unique, &held, 0)) {
            e = &ring->entries[i];
            break;
        }
    }
    if (!e) return -1;
    size_t total = 0, payload = 0;
    for (int i = 0; i < count; i++) total += iov[i].iov_len;
    int32_t error;
    memcpy(&error, (const char *)iov[0].iov_base + 4, 4);
    char *dest = payload_of(e);
    if (total - OUT_HEADER > ring->payload_size) {
        error = -EIO;  // cannot happen with the sizes negotiated; answer rather than hang
    } else {
        // The reply may overlap the request's own arguments (they share the payload): memmove.
        size_t skip = OUT_HEADER;
        for (int i = 0; i < count; i++) {
            size_t n = iov[i].iov_len;
            const char *src = iov[i].iov_base;
            if (skip >= n) { skip -= n; continue; }
            memmove(dest + payload, src + skip, n - skip);
            payload += n - skip;
            skip = 0;
        }
    }
    uint32_t out[4];
    out[0] = (uint32_t)(OUT_HEADER + (error ? 0 : payload));
    memcpy(&out[1], &error, 4);
    memcpy(&out[2], &unique, 8);
    memcpy(e->header->in_out, out, OUT_HEADER);
    e->header->ent.payload_sz = error ? 0 : (uint32_t)payload;
    if (pthread_equal(pthread_self(), e->thread) && e->in_handler) {
        e->commit_due = 1;
        return (ssize_t)total;
    }
    if (!pthread_equal(pthread_self(), e->thread)) {
        atomic_store(&e->reply_ready, 1);
        uint64_t one = 1;
        if (write(e->kick, &one, sizeof one) != sizeof one) {
            errno = EIO;
            return -2;
        }
        return (ssize_t)total;
    }
    pthread_mutex_lock(&e->submit);
    int r = submit_locked(e, CMD_COMMIT_AND_FETCH);
    pthread_mutex_unlock(&e->submit);
    if (r < 0) {
        errno = -r;
        return -2;
    }
    return (ssize_t)total;
}

uint64_t coffer_ring_requests(coffer_ring *ring) { return ring ? atomic_load(&ring->requests) : 0; }

int coffer_ring_failure(coffer_ring *ring) { return ring ? atomic_load(&ring->failure) : 0; }

void coffer_ring_stop(coffer_ring *ring) {
    if (!ring || atomic_exchange(&ring->stopping, 1)) return;
    if (ring->stop_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(ring->stop_fd, &one, sizeof one);
        (void)w;
    }
    for (unsigned i = 0; i < ring->count; i++)
        if (ring->entries[i].thread_started) pthread_join(ring->entries[i].thread, NULL);
}

void coffer_ring_free(coffer_ring *ring) {
    if (!ring) return;
    coffer_ring_stop(ring);
    for (unsigned i = 0; i < ring->count; i++) free_entry(&ring->entries[i]);
    if (ring->stop_fd >= 0) close(ring->stop_fd);
    free(ring);
}
