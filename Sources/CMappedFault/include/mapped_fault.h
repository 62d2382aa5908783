#ifndef COFFER_MAPPED_FAULT_H
#define COFFER_MAPPED_FAULT_H

/// Installs (once per process) a SIGBUS handler for reads through memory-mapped stores: a page of a
/// read-only shared file mapping (how SQLite maps a database; libraries are mapped private) that lies
/// past the file's end (someone truncated the file while it was mapped) is replaced by a page of zeros,
/// which SQLite then reports as a damaged page, instead of the process dying. Every other SIGBUS keeps
/// its default action. Returns 0, or -1 with errno.
int coffer_mapped_fault_install(void);

/// How many pages the handler has replaced since the process started.
unsigned long coffer_mapped_fault_count(void);

#endif
