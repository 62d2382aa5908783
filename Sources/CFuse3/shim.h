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

/* Expires a name (the next walk through it asks again) rather than dropping it. libfuse 3.16 dropped the
   flags argument (it always expires there); a kernel before 6.2 ignores the flag and drops the name. */
static inline int coffer_expire_entry(struct fuse_session *se, fuse_ino_t parent, const char *name, size_t namelen) {
#if FUSE_MAJOR_VERSION == 3 && FUSE_MINOR_VERSION < 16
    return fuse_lowlevel_notify_expire_entry(se, parent, name, namelen, FUSE_LL_EXPIRE_ONLY);
#else
    return fuse_lowlevel_notify_expire_entry(se, parent, name, namelen);
#endif
}

/* Names the calling thread (prctl is variadic and pthread_setname_np needs _GNU_SOURCE: neither imports). */
static inline void coffer_name_this_thread(const char *name) { prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0); }
#endif
