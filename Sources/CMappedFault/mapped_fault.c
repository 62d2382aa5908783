// SIGBUS from a truncated, memory-mapped store: see include/mapped_fault.h. Everything the handler
// calls is async-signal-safe (open, read, close, mmap, sigaction, raise; no allocation, no locks).
#define _GNU_SOURCE
#include "mapped_fault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uintptr_t pageSize;
static atomic_ulong replaced;
static struct sigaction previous;
static pthread_mutex_t installing = PTHREAD_MUTEX_INITIALIZER;
static int installed;

static int hexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/// The start of one line of /proc/self/maps ("start-end perms offset dev inode   path"): whether it
/// maps `address` read-only and shared.
static int lineMaps(const char *head, size_t headLength, uintptr_t address) {
    uintptr_t start = 0, end = 0;
    size_t i = 0;
    int d;
    while (i < headLength && (d = hexDigit(head[i])) >= 0) { start = start * 16 + (uintptr_t)d; i++; }
    if (i >= headLength || head[i] != '-') return 0;
    i++;
    while (i < headLength && (d = hexDigit(head[i])) >= 0) { end = end * 16 + (uintptr_t)d; i++; }
    if (address < start || address >= end || i + 5 > headLength) return 0;
    return memcmp(head + i, " r--s", 5) == 0;
}

/// Whether `address` lies in a read-only shared mapping of a file.
static int inSharedFileMapping(uintptr_t address) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buffer[4096], head[64];
    size_t headLength = 0;
    int found = 0, file = 0;
    ssize_t n;
    while (!found && (n = read(fd, buffer, sizeof buffer)) > 0) {
        for (ssize_t i = 0; i < n && !found; i++) {
            char c = buffer[i];
            if (c == '\n') {
                found = file && lineMaps(head, headLength, address);
                headLength = 0;
                file = 0;
                continue;
            }
            if (headLength < sizeof head) head[headLength++] = c;
            if (c == '/') file = 1;  // the path column (the columns before it hold no '/')
        }
    }
    close(fd);
    return found;
}

static void onSIGBUS(int signal, siginfo_t *info, void *context) {
    (void)context;
    uintptr_t address = (uintptr_t)info->si_addr;
    if (info->si_code == BUS_ADRERR && inSharedFileMapping(address)) {
        void *page = (void *)(address & ~(pageSize - 1));
        if (mmap(page, pageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == page) {
            atomic_fetch_add(&replaced, 1);
            return;  // the read runs again and finds zeros
        }
    }
    // Not ours: what would have happened without this handler. A fault comes again on return and meets
    // the previous action; a signal someone sent is raised again (blocked until the handler returns).
    sigaction(SIGBUS, &previous, NULL);
    if (info->si_code <= 0) raise(signal);
}

int coffer_mapped_fault_install(void) {
    pthread_mutex_lock(&installing);
    int result = 0;
    if (!installed) {
        pageSize = (uintptr_t)sysconf(_SC_PAGESIZE);
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = onSIGBUS;
        action.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, &previous) == 0) installed = 1; else result = -1;
    }
    pthread_mutex_unlock(&installing);
    return result;
}

unsigned long coffer_mapped_fault_count(void) { return atomic_load(&replaced); }
