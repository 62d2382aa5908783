#ifndef COFFER_SQLITE_CONFIG_H
#define COFFER_SQLITE_CONFIG_H

/// sqlite3_config is variadic, so Swift cannot call it: process-wide SQLite settings, made before the
/// first connection opens (afterwards SQLite refuses them with SQLITE_MISUSE and keeps its defaults).

/// Statement journals stay in memory up to `bytes`, then spill to a temporary file
/// (SQLITE_CONFIG_STMTJRNL_SPILL). Returns SQLite's result code.
int coffer_sqlite_statement_journal_spill(int bytes);

#endif
