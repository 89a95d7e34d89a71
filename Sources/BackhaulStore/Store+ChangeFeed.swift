import BackhaulCore
import SQLite

/// Every write of a task row goes through `TaskRows`, which reports it here, to the open
/// transaction's `ChangeLog`: what others act on (queue membership, leaving `running`, timers,
/// downloads that ended unfinished) and the per-session counts. No other code writes the `tasks`
/// table (`TaskRowsOnlyTests` holds the sources to that), so whatever path changes a task, the
/// engine hears of it; a write that is rolled back takes its notes back with it (`ChangeLog.mark`).
///
/// These notes were TEMP triggers until the per-task work of issue 16: a trigger program, and the
/// statement journal a trigger forces on every statement it fires for, cost 29,000 instructions
/// per insert or update of a task, three of which every task makes.
struct TaskFeed {
    let log: ChangeLog
    let state: WriterState

    func inserted(_ task: TaskRecord) { changed(from: nil, to: task, configurationChanged: false) }

    /// A row updated from `before` (as it was) to `after`.
    func updated(from before: TaskRecord, to after: TaskRecord) {
        if before.state == .queued {
            // A queued task's copy held by the engine is out of date, whatever column changed.
            if after.state == .queued {
                state.touchedQueued.insert(after.sequence)
                log.update { $0.touched.append(after.sequence) }
            } else {
                state.touchedQueued.remove(after.sequence)
            }
        }
        let configurationChanged = before.configurationOverrides != after.configurationOverrides
        guard
            configurationChanged || before.state != after.state || before.priority != after.priority
                || before.request != after.request || before.nextAttemptAt != after.nextAttemptAt
                || before.earliestBeginAt != after.earliestBeginAt || before.deadlineAt != after.deadlineAt
        else { return }
        changed(from: before, to: after, configurationChanged: configurationChanged)
    }

    /// A row deleted; `session` is its `session_id` column ('' once detached).
    func deleted(sequence: Int64, id: String, session: String, state taskState: TaskState) {
        if taskState == .queued {
            state.touchedQueued.remove(sequence)
            log.update { $0.unqueued.append(sequence) }
        }
        if taskState == .running { log.update { $0.leftRunning.append(id) } }
        log.countMove(from: session, taskState.rawValue, to: nil, nil)
    }

    private func changed(from before: TaskRecord?, to after: TaskRecord, configurationChanged: Bool) {
        log.update { changes in
            if after.state == .queued {
                let key = Scheduler.Key(session: after.sessionID, host: after.request.hostKey)
                let limit = after.configurationOverrides["max_connections_per_host"]?.intValue.map { Int($0) }
                changes.queued.append(Scheduler.Entry(sequence: after.sequence, priority: after.priority, key: key, limit: limit))
            } else if before?.state == .queued {
                changes.unqueued.append(after.sequence)
            }
            if before?.state == .running, after.state != .running { changes.leftRunning.append(after.id) }
            if after.state == .retrying { changes.noteTimer(after.nextAttemptAt) }
            if after.state == .waiting { changes.noteTimer(after.earliestBeginAt) }
            if !after.state.isFinal { changes.noteTimer(after.deadlineAt) }
            // A held task whose own configuration changed may be allowed now: the policy decides again.
            if configurationChanged, after.state == .waiting { changes.policyReview = true }
        }
        // The per-session counts follow every change of state.
        if before?.state != after.state || before?.sessionID != after.sessionID {
            log.countMove(from: before?.sessionID, before?.state.rawValue, to: after.sessionID, after.state.rawValue)
        }
        // A download that ends without completing leaves no `.part` file (removed after the commit).
        if after.kind == .download, after.state.isFinal, after.state != .completed, let before, !before.state.isFinal {
            log.downloadEnded(after.file.path)
        }
    }
}

extension Store {
    /// Where `TaskRows` reports the writes of this transaction (the writer's thread only).
    var feed: TaskFeed { TaskFeed(log: log, state: writerState) }

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
