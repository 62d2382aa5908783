#ifndef COFFER_CPOSTGRES_SHIM_H
#define COFFER_CPOSTGRES_SHIM_H
/* libpq, PostgreSQL's C client (Debian's libpq-dev): synchronous calls and pipeline mode (libpq >= 14). */
#include <libpq-fe.h>
#endif
