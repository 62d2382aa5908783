#ifndef COFFER_CFUSE3_SHIM_H
#define COFFER_CFUSE3_SHIM_H
#define FUSE_USE_VERSION 312
/* No _FILE_OFFSET_BITS here: on 64-bit Linux off_t is already 64-bit (fuse_common.h checks), and defining it
   makes this module's copies of libc structs (stat, statvfs, flock) differ from Glibc's, which clang rejects
   ("'statvfs' has different definitions in different modules") in any Swift file importing both. */
#include <fuse_lowlevel.h>
#include <fuse_opt.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <sys/file.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>

/* O_DIRECT (fcntl.h gives it only with _GNU_SOURCE): a WRITE's open flags tell direct writes apart. */
enum { COFFER_O_DIRECT = __O_DIRECT };

/* Names the calling thread (prctl is variadic and pthread_setname_np needs _GNU_SOURCE: neither imports). */
static inline void coffer_name_this_thread(const char *name) { prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0); }
#endif
