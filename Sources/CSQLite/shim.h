#ifndef BACKHAUL_CSQLITE_SHIM_H
#define BACKHAUL_CSQLITE_SHIM_H
#include <sqlite3.h>

/// Turns SQLite's memory statistics off (`SQLITE_CONFIG_MEMSTATUS`): with them on, every
/// allocation and free takes a global mutex to count. `sqlite3_config` is variadic, which Swift
/// cannot call; it works only before the library initializes (returns SQLITE_MISUSE after).
static inline int bh_sqlite3_disable_memstatus(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

#endif
