#include <sqlite3.h>
#include "sqlite_config.h"

int coffer_sqlite_statement_journal_spill(int bytes) {
    return sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL, bytes);
}
