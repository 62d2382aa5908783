// SIGINT, SIGTERM and SIGHUP for a mount: see include/stop_signals.h. The handler calls write(2) only.
#define _GNU_SOURCE
#include "stop_signals.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int stopSignals[3] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction previous[3], previousWake;
static volatile sig_atomic_t pipeFD = -1;

static void onStop(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    int fd = pipeFD;
    if (fd >= 0) {
        ssize_t ignored = write(fd, &b, 1);
        (void)ignored;
    }
    errno = saved;
}

static void onWake(int sig) { (void)sig; }

int coffer_stop_signals_install(int fd) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = onWake;
    if (sigaction(SIGURG, &sa, &previousWake) != 0) return -1;
    pipeFD = fd;
    sa.sa_handler = onStop;
    for (int i = 0; i < 3; i++) {
        if (sigaction(stopSignals[i], &sa, &previous[i]) != 0) {
            int saved = errno;
            while (i-- > 0) sigaction(stopSignals[i], &previous[i], NULL);
            sigaction(SIGURG, &previousWake, NULL);
            pipeFD = -1;
            errno = saved;
            return -1;
        }
    }
    return 0;
}

void coffer_stop_signals_remove(void) {
    for (int i = 0; i < 3; i++) sigaction(stopSignals[i], &previous[i], NULL);
    sigaction(SIGURG, &previousWake, NULL);
    pipeFD = -1;
}

int coffer_stop_signals_wake(pthread_t thread) { return pthread_kill(thread, SIGURG); }

int coffer_syncfs(int fd) { return syncfs(fd); }
