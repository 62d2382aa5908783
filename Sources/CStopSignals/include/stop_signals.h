#ifndef COFFER_STOP_SIGNALS_H
#define COFFER_STOP_SIGNALS_H

#include <pthread.h>

/// Replaces the handlers of SIGINT, SIGTERM and SIGHUP (remembering the ones in place) with one that only
/// writes the signal's number, one byte, to `fd` (a non-blocking pipe a mount's thread reads: write(2) is
/// async-signal-safe, unmounting is not), and installs a handler that does nothing for SIGURG (see
/// coffer_stop_signals_wake). Neither restarts an interrupted call, as libfuse's own handlers. Returns 0, or -1
/// with errno (nothing replaced).
int coffer_stop_signals_install(int fd);

/// Puts back the handlers coffer_stop_signals_install replaced; writes to its `fd` stop.
void coffer_stop_signals_remove(void);

/// Interrupts a blocking call of `thread` (a session loop waiting in sem_wait or poll, which nothing else wakes
/// once the mount is detached) with SIGURG, whose default action is to ignore it: harmless after removal too.
int coffer_stop_signals_wake(pthread_t thread);

/// syncfs(2) (a GNU call Swift does not see): the kernel's dirty pages of the filesystem holding `fd`, written.
int coffer_syncfs(int fd);

#endif
