/* The least the embedded store's run must do, in C: open the SQLite file as
 * leaderrun does (WAL, synchronous=NORMAL, copied back at 128 WAL pages,
 * no checkpoint at close), one write transaction to acquire (a lease named
 * "floor"), start the command and wait for it, one write transaction to
 * release. No watchdog, no cgroup, no logging: a floor for
 * tests/bench/startup.sh, not a lease client.
 *
 *   cc -O2 -o floor floor.c -lsqlite3 && ./floor DB COMMAND [ARG...]
 */
#include <sqlite3.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int run(sqlite3 *db, const char *sql) {
    char *err = 0;
    if (sqlite3_exec(db, sql, 0, 0, &err) != SQLITE_OK) {
        fprintf(stderr, "floor: %s\n", err ? err : "error");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    sqlite3 *db;
    if (argc < 3 || sqlite3_open(argv[1], &db) != SQLITE_OK) {
        fprintf(stderr, "usage: floor DB COMMAND [ARG...]\n");
        return 2;
    }
    sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)0);
    if (run(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=128;"
                "PRAGMA busy_timeout=1000;"
                "CREATE TABLE IF NOT EXISTS leader_lease (name TEXT PRIMARY KEY, holder TEXT,"
                " epoch INTEGER NOT NULL DEFAULT 0, expires_at INTEGER NOT NULL DEFAULT 0,"
                " boot_id TEXT NOT NULL DEFAULT '');"
                "BEGIN IMMEDIATE;"
                "INSERT INTO leader_lease (name, holder, epoch, expires_at, boot_id)"
                " VALUES ('floor', 'h', 1, 0, '') ON CONFLICT (name) DO UPDATE"
                " SET epoch = epoch + 1 RETURNING epoch;"
                "COMMIT;"))
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return 1;
    if (run(db, "BEGIN IMMEDIATE; UPDATE leader_lease SET holder = NULL WHERE name = 'floor'; COMMIT;"))
        return 1;
    sqlite3_close(db);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
