#ifndef BACKHAUL_CSQLITE_SHIM_H
#define BACKHAUL_CSQLITE_SHIM_H
#include <sqlite3.h>
#endif
