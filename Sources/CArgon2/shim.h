#ifndef COFFER_CARGON2_SHIM_H
#define COFFER_CARGON2_SHIM_H
#include <argon2.h>
#endif
