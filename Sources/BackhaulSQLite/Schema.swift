import BackhaulQueue
import SQLite

/// The schema, as numbered migrations. Never edit a shipped migration: add the next one.
enum Schema {
    static let migrations: [Migration] = [
        Migration(
            1,
            """
            CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                configuration TEXT NOT NULL,
                enabled INTEGER NOT NULL DEFAULT 1,
                lifecycle TEXT NOT NULL DEFAULT 'active',
                created_at REAL NOT NULL
            );
            CREATE TABLE tasks (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                session_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                state TEXT NOT NULL,
                waiting_reason TEXT,
                file_path TEXT NOT NULL,
                file_size INTEGER NOT NULL,
                file_mtime_ns INTEGER NOT NULL,
                request TEXT NOT NULL,
                upload TEXT NOT NULL,
                host_key TEXT NOT NULL,
                priority REAL NOT NULL,
                description TEXT,
                idempotency_key TEXT,
                delete_file_on_success INTEGER NOT NULL DEFAULT 0,
                configuration TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                bytes_sent INTEGER NOT NULL DEFAULT 0,
                created_at REAL NOT NULL,
                started_at REAL,
                finished_at REAL,
                next_attempt_at REAL,
                earliest_begin_at REAL,
                deadline_at REAL NOT NULL,
                response TEXT,
                error TEXT,
                cancellation INTEGER,
                checkpoint TEXT
            );
            CREATE UNIQUE INDEX tasks_idempotency ON tasks (session_id, idempotency_key)
                WHERE idempotency_key IS NOT NULL;
            CREATE INDEX tasks_by_session ON tasks (session_id, state, seq);
            CREATE INDEX tasks_queue ON tasks (state, priority DESC, seq);
            CREATE INDEX tasks_timers ON tasks (state, next_attempt_at);
            CREATE INDEX tasks_deadlines ON tasks (deadline_at)
                WHERE state NOT IN ('completed', 'failed', 'cancelled');
            CREATE TABLE events (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                type TEXT NOT NULL,
                session_id TEXT NOT NULL,
                task_id TEXT,
                created_at REAL NOT NULL,
                data TEXT NOT NULL
            );
            CREATE INDEX events_by_session ON events (session_id, seq);
            """),
        Migration(
            2,
            """
            CREATE TABLE webhooks (
                id TEXT PRIMARY KEY,
                session_id TEXT NOT NULL,
                url TEXT NOT NULL,
                events TEXT NOT NULL,
                secret TEXT NOT NULL,
                previous_secret TEXT,
                previous_secret_expires_at REAL,
                enabled INTEGER NOT NULL DEFAULT 1,
                disabled_reason TEXT,
                created_at REAL NOT NULL
            );
            CREATE INDEX webhooks_by_session ON webhooks (session_id);
            CREATE TABLE deliveries (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                webhook_id TEXT NOT NULL,
                event_seq INTEGER NOT NULL,
                event_type TEXT NOT NULL,
                state TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at REAL,
                last_status INTEGER,
                last_error TEXT,
                history TEXT NOT NULL DEFAULT '[]',
                created_at REAL NOT NULL,
                finished_at REAL
            );
            CREATE INDEX deliveries_due ON deliveries (state, next_attempt_at);
            CREATE INDEX deliveries_by_webhook ON deliveries (webhook_id, seq);
            CREATE INDEX events_by_time ON events (created_at);
            """),
        Migration(
            3,
            """
            CREATE TABLE cleanups (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                task_id TEXT NOT NULL,
                request TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at REAL NOT NULL,
                created_at REAL NOT NULL
            );
            CREATE INDEX cleanups_due ON cleanups (next_attempt_at);
            """),
        Migration(
            4,
            """
            CREATE TABLE settings (
                key TEXT PRIMARY KEY,
                value TEXT NOT NULL
            );
            CREATE TABLE budget_usage (
                day TEXT NOT NULL,
                network_type TEXT NOT NULL,
                bytes INTEGER NOT NULL,
                PRIMARY KEY (day, network_type)
            );
            CREATE INDEX tasks_waiting ON tasks (state, waiting_reason, seq);
            """),
        Migration(
            5,
            """
            ALTER TABLE tasks ADD COLUMN download TEXT;
            """),
        // A removed session leaves its tasks readable (OpenAPI/backhaul.yaml): `session_id` becomes '' (no
        // session), `detached_from` keeps the id it had. Failures a client sees before the end:
        // `last_error` and the attempt history. Task counts per session and state, kept by the
        // writer from its change feed (one upsert per session and state a transaction touched),
        // so a session's counts and its open-task limit cost no walk over its tasks.
        Migration(
            6,
            """
            ALTER TABLE tasks ADD COLUMN detached_from TEXT;
            ALTER TABLE tasks ADD COLUMN last_error TEXT;
            DROP INDEX tasks_idempotency;
            CREATE UNIQUE INDEX tasks_idempotency ON tasks (session_id, idempotency_key)
                WHERE idempotency_key IS NOT NULL AND detached_from IS NULL;
            CREATE TABLE attempts (
                task_seq INTEGER NOT NULL,
                number INTEGER NOT NULL,
                started_at REAL NOT NULL,
                ended_at REAL NOT NULL,
                bytes_sent INTEGER NOT NULL,
                bytes_received INTEGER NOT NULL,
                outcome TEXT NOT NULL,
                http_status INTEGER,
                error TEXT,
                network_type TEXT,
                PRIMARY KEY (task_seq, number)
            ) WITHOUT ROWID;
            CREATE TABLE session_counts (
                session_id TEXT NOT NULL,
                state TEXT NOT NULL,
                count INTEGER NOT NULL,
                PRIMARY KEY (session_id, state)
            ) WITHOUT ROWID;
            INSERT INTO session_counts (session_id, state, count)
                SELECT session_id, state, COUNT(*) FROM tasks GROUP BY session_id, state;
            CREATE TRIGGER attempts_of_deleted_task AFTER DELETE ON tasks BEGIN
                DELETE FROM attempts WHERE task_seq = OLD.seq;
            END;
            """),
        // Months of uptime (docs/uptime.md): finished tasks found by age for retention, and their
        // events and deliveries by task; freed pages returned to the file system.
        // The partial indexes' conditions are written without IN lists: SQLite evaluates an IN list
        // through an ephemeral table, which for a partial index meant two of them built on every
        // update of a task (a tenth of the daemon's instructions per task).
        // Fewer index entries to keep on every change of a task's state: the queue lives in the
        // engine's memory now (it loads it once through tasks_held, where queued tasks sort by seq),
        // which holds only queued and waiting tasks (starting and finishing touch it once, or not);
        // retries are found through a partial index of retrying tasks only.
        Migration(
            7,
            """
            DROP INDEX tasks_waiting;
            CREATE INDEX tasks_held ON tasks (state, waiting_reason, seq) WHERE (state = 'queued' OR state = 'waiting');
            DROP INDEX tasks_queue;
            DROP INDEX tasks_timers;
            CREATE INDEX tasks_retries ON tasks (next_attempt_at) WHERE state = 'retrying';
            DROP INDEX tasks_deadlines;
            CREATE INDEX tasks_deadlines ON tasks (deadline_at)
                WHERE state != 'completed' AND state != 'failed' AND state != 'cancelled';
            CREATE INDEX tasks_finished ON tasks (finished_at) WHERE (state = 'completed' OR state = 'failed' OR state = 'cancelled');
            CREATE INDEX events_by_task ON events (task_id) WHERE task_id IS NOT NULL;
            CREATE INDEX deliveries_by_event ON deliveries (event_seq);
            """),
        Migration(8, "PRAGMA auto_vacuum = INCREMENTAL; VACUUM", transactional: false),
        // Deadlines by `finished_at IS NULL` rather than by state: a task's start changes its state
        // but not `finished_at`, so its entry here stays put. `finished_at` is set exactly when a
        // task enters a final state, which it never leaves; the queries keep their state condition too.
        Migration(
            9,
            """
            DROP INDEX tasks_deadlines;
            CREATE INDEX tasks_deadlines ON tasks (deadline_at) WHERE finished_at IS NULL;
            """),
        // No index keyed by `state` that every task moves through: an entry of (session_id, state,
        // seq) was deleted and inserted again at a task's start and at its end, 26,000
        // instructions a task (measured alone on this schema). A session's tasks are indexed by
        // seq; its unfinished ones, which quota and session changes read, by a partial index
        // that a task leaves once, when it finishes; finished tasks by `finished_at IS NOT NULL`,
        // which a start does not touch.
        Migration(
            10,
            """
            DROP INDEX tasks_by_session;
            CREATE INDEX tasks_by_session ON tasks (session_id, seq);
            CREATE INDEX tasks_open ON tasks (session_id, seq) WHERE finished_at IS NULL;
            DROP INDEX tasks_finished;
            CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
            """),
        // Two fewer index entries for every event (about 12,000 instructions each, measured alone):
        // an event's id is made unique by construction (its time and 75 random bits) and never
        // looked up, so it needs no UNIQUE index, which only a copy of the table drops; and events
        // are appended in time order, so age pruning walks them by seq instead of by an index of
        // `created_at`. The copy keeps every seq and the table's AUTOINCREMENT high-water mark
        // (dropping a table drops its sqlite_sequence row), so no seq is ever given twice.
        Migration(
            11,
            """
            CREATE TABLE events_copy (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL,
                type TEXT NOT NULL,
                session_id TEXT NOT NULL,
                task_id TEXT,
                created_at REAL NOT NULL,
                data TEXT NOT NULL
            );
            INSERT INTO events_copy (seq, id, type, session_id, task_id, created_at, data)
                SELECT seq, id, type, session_id, task_id, created_at, data FROM events ORDER BY seq;
            DELETE FROM sqlite_sequence WHERE name = 'events_copy';
            INSERT INTO sqlite_sequence (name, seq) SELECT 'events_copy', seq FROM sqlite_sequence WHERE name = 'events';
            DROP TABLE events;
            ALTER TABLE events_copy RENAME TO events;
            CREATE INDEX events_by_session ON events (session_id, seq);
            CREATE INDEX events_by_task ON events (task_id) WHERE task_id IS NOT NULL;
            """),
        // Scheduled tasks by the time they are due: the timers found them through tasks_held and
        // read every one's row, on every tick of the engine and after every enqueue, so a night
        // window's queue of a million tasks made each enqueue slower than the last.
        Migration(
            12,
            """
            CREATE INDEX tasks_scheduled ON tasks (earliest_begin_at) WHERE state = 'waiting' AND waiting_reason = 'scheduled';
            """),
    ]
}
