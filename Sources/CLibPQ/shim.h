#ifndef BACKHAUL_CLIBPQ_SHIM_H
#define BACKHAUL_CLIBPQ_SHIM_H
// libpq, PostgreSQL's client library (Debian: libpq-dev puts it under /usr/include/postgresql).
#include <postgresql/libpq-fe.h>

#endif
