#ifndef COFFER_FILE_SPACE_H
#define COFFER_FILE_SPACE_H

#include <sys/types.h>

/// Linux calls that Swift's Glibc module does not export (they need _GNU_SOURCE), for segment files.

/// Gives the blocks of [offset, offset+length) back to the disk; the file keeps its length
/// (fallocate(2) with FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). Returns 0, or -1 with errno.
int coffer_punch_hole(int fd, off_t offset, off_t length);

/// Starts writeback of [offset, offset+length) without waiting for it (sync_file_range(2) with
/// SYNC_FILE_RANGE_WRITE), so a later fdatasync finds little left to write. Returns 0, or -1 with errno.
int coffer_start_writeback(int fd, off_t offset, off_t length);

/// Turns O_DIRECT on (`on` != 0) or off for fd (fcntl F_SETFL). Returns 0, or -1 with errno (EINVAL:
/// the filesystem has no direct I/O).
int coffer_set_direct(int fd, int on);

#endif
