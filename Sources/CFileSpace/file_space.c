#define _GNU_SOURCE
#include <fcntl.h>
#include "file_space.h"

int coffer_punch_hole(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}

int coffer_start_writeback(int fd, off_t offset, off_t length) {
    return sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE);
}

int coffer_set_direct(int fd, int on) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return -1;
    return fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT);
}
