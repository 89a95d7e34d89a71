import BackhaulCore
import SQLite

/// TEMP triggers on the writer's connection report every change of a task that others act on
/// (queue membership, leaving `running`, timers, downloads that ended unfinished) into the open
/// transaction's `ChangeLog`: whatever code path writes a task, the engine hears of it.
extension Store {
    static func installChangeFeed(_ db: Connection, log: ChangeLog, state: WriterState) throws {
        try db.defineFunction("backhaul_task_changed", arguments: 14) { arguments in
            Store.noteTaskChange(arguments, log: log)
        }
        // Arguments: seq, whether it is still queued.
        try db.defineFunction("backhaul_queued_task_touched", arguments: 2) { arguments in
            let sequence = arguments.int(0)
            if arguments.int(1) != 0 {
                state.touchedQueued.insert(sequence)
                log.update { $0.touched.append(sequence) }
            } else {
                state.touchedQueued.remove(sequence)
            }
        }
        let new = """
            NEW.seq, NEW.state, NEW.priority, NEW.session_id, NEW.host_key,
            CASE WHEN NEW.configuration = '{}' THEN NULL ELSE json_extract(NEW.configuration, '$.max_connections_per_host') END,
            NEW.id, NEW.next_attempt_at, NEW.earliest_begin_at, NEW.deadline_at,
            CASE WHEN NEW.kind = 'download' THEN NEW.file_path END
            """
        let configurationChanged = "OLD.configuration IS NOT NEW.configuration"
        try db.execute(
            """
            CREATE TEMP TRIGGER feed_insert AFTER INSERT ON main.tasks
            BEGIN SELECT backhaul_task_changed(NULL, \(new), 0, NULL); END;
            CREATE TEMP TRIGGER feed_update AFTER UPDATE OF state, priority, host_key, session_id, configuration, next_attempt_at,
                earliest_begin_at, deadline_at ON main.tasks
            BEGIN SELECT backhaul_task_changed(OLD.state, \(new), \(configurationChanged), OLD.session_id); END;
            CREATE TEMP TRIGGER feed_touch AFTER UPDATE ON main.tasks WHEN OLD.state = 'queued'
            BEGIN SELECT backhaul_queued_task_touched(OLD.seq, NEW.state = 'queued'); END;
            CREATE TEMP TRIGGER feed_touch_delete AFTER DELETE ON main.tasks WHEN OLD.state = 'queued'
            BEGIN SELECT backhaul_queued_task_touched(OLD.seq, 0); END;
            CREATE TEMP TRIGGER feed_delete AFTER DELETE ON main.tasks
            BEGIN SELECT backhaul_task_changed(OLD.state, OLD.seq, NULL, 0, '', '', NULL, OLD.id, NULL, NULL, NULL, NULL, 0,
                OLD.session_id); END;
            """)
    }

    /// Arguments: old state, seq, new state, priority, session, host, own limit, id, next attempt,
    /// earliest begin, deadline, download destination, whether its own configuration changed, old
    /// session.
    private static func noteTaskChange(_ arguments: FunctionArguments, log: ChangeLog) {
        let wasQueued = arguments.text(0, is: "queued")
        let wasRunning = arguments.text(0, is: "running")
        let isQueued = arguments.text(2, is: "queued")
        let sequence = arguments.int(1)
        log.update { changes in
            if isQueued {
                let key = Scheduler.Key(session: arguments.string(4) ?? "", host: arguments.string(5) ?? "")
                changes.queued.append(
                    Scheduler.Entry(
                        sequence: sequence, priority: arguments.double(3), key: key,
                        limit: arguments.optionalInt(6).map { Int($0) }))
            } else if wasQueued {
                changes.unqueued.append(sequence)
            }
            if wasRunning, !arguments.text(2, is: "running") { changes.leftRunning.append(arguments.string(7) ?? "") }
            if arguments.text(2, is: "retrying") { changes.noteTimer(arguments.optionalDouble(8)) }
            if arguments.text(2, is: "waiting") { changes.noteTimer(arguments.optionalDouble(9)) }
            if !arguments.isNull(2), !isFinal(arguments, 2) { changes.noteTimer(arguments.optionalDouble(10)) }
            // A held task whose own configuration changed may be allowed now: the policy decides again.
            if arguments.int(12) != 0, arguments.text(2, is: "waiting") { changes.policyReview = true }
        }
        // The per-session counts follow every change of state or session.
        let oldState = arguments.string(0)
        let newState = arguments.string(2)
        let oldSession = arguments.string(13)
        let newSession = arguments.isNull(2) ? nil : arguments.string(4)
        if oldState != newState || oldSession != newSession {
            log.countMove(from: oldSession, oldState, to: newSession, newState)
        }
        // A download that ends without completing leaves no `.part` file (removed after the commit).
        if let destination = arguments.string(11), isFinal(arguments, 2), !arguments.text(2, is: "completed"),
            !arguments.isNull(0), !isFinal(arguments, 0)
        {
            log.downloadEnded(destination)
        }
    }

    private static func isFinal(_ arguments: FunctionArguments, _ index: Int32) -> Bool {
        arguments.text(index, is: "completed") || arguments.text(index, is: "failed") || arguments.text(index, is: "cancelled")
    }

    /// Any write to `webhooks` (whichever code path, committed or rolled back) makes the writer's
    /// list of sessions with subscriptions unknown; it is read again when next needed.
    static func installWebhookFeed(_ db: Connection, state: WriterState) throws {
        try db.defineFunction("backhaul_webhooks_changed", arguments: 0) { _ in state.sessionsWithWebhooks = nil }
        try db.execute(
            """
            CREATE TEMP TRIGGER webhooks_inserted AFTER INSERT ON main.webhooks BEGIN SELECT backhaul_webhooks_changed(); END;
            CREATE TEMP TRIGGER webhooks_updated AFTER UPDATE ON main.webhooks BEGIN SELECT backhaul_webhooks_changed(); END;
            CREATE TEMP TRIGGER webhooks_deleted AFTER DELETE ON main.webhooks BEGIN SELECT backhaul_webhooks_changed(); END;
            """)
    }

    /// Whether the session has an enabled subscription (see `WriterState.sessionsWithWebhooks`).
    func hasWebhooks(_ db: Connection, sessionID: String) throws -> Bool {
        if let known = writerState.sessionsWithWebhooks { return known.contains(sessionID) }
        let sessions = Set(try db.query("SELECT DISTINCT session_id FROM webhooks WHERE enabled = 1", []) { $0.string(0) })
        writerState.sessionsWithWebhooks = sessions
        return sessions.contains(sessionID)
    }
}
