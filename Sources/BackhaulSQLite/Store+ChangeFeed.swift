import BackhaulCore
import BackhaulQueue
import SQLite

/// Every write of a task row goes through `TaskRows`, which reports it here, to the open
/// transaction's `ChangeRecorder`: what others act on (queue membership, leaving `running`, timers,
/// downloads that ended unfinished) and the per-session counts. No other code writes the `tasks`
/// table (`TaskRowsOnlyTests` holds the sources to that), so whatever path changes a task, the
/// engine hears of it; a write that is rolled back takes its notes back with it (`ChangeRecorder.mark`).
/// (Kept in Swift rather than by TEMP triggers: a trigger forces a statement journal on every
/// statement it fires for; BENCHMARKS.md has the cost.)
struct TaskFeed {
    let recorder: ChangeRecorder

    func inserted(_ task: TaskRecord) { changed(from: nil, to: task) }

    /// A row updated from `before` (as it was) to `after`.
    func updated(from before: TaskRecord, to after: TaskRecord) {
        if before.state == .queued {
            // A queued task's copy held by the engine is out of date, whatever column changed.
            if after.state == .queued {
                recorder.markTouched(after.sequence)
            } else {
                recorder.settleTouched(after.sequence)
            }
        }
        guard StoreChanges.concerns(from: before, to: after) else { return }
        changed(from: before, to: after)
    }

    /// A removed session's tasks (all final) were detached: its pending counts go with it.
    func detached(session: String) { recorder.forgetCounts(session) }

    /// A row deleted; `session` is its `session_id` column ('' once detached).
    func deleted(sequence: Int64, id: String, session: String, state: TaskState) {
        if state == .queued {
            recorder.settleTouched(sequence)
            recorder.update { $0.unqueued.append(sequence) }
        }
        if state == .running { recorder.update { $0.leftRunning.append(id) } }
        recorder.countMove(from: session, state.rawValue, to: nil, nil)
    }

    private func changed(from before: TaskRecord?, to after: TaskRecord) {
        recorder.update { $0.note(from: before, to: after) }
        // The per-session counts follow every change of state.
        if before?.state != after.state || before?.sessionID != after.sessionID {
            recorder.countMove(from: before?.sessionID, before?.state.rawValue, to: after.sessionID, after.state.rawValue)
        }
        // A completed task's file with `delete_file_on_success`, a `.part` file of a download that
        // ends without completing: removed after the durable commit.
        recorder.noteFiles(from: before, to: after)
    }
}

extension Store {
    /// Where `TaskRows` reports the writes of this transaction (the writer's thread only).
    var feed: TaskFeed { TaskFeed(recorder: recorder) }

    /// Any write to `webhooks` (whichever code path, committed or rolled back) makes the writer's
    /// list of sessions with subscriptions unknown; it is read again when next needed.
    static func installWebhookFeed(_ db: Connection, state: WriterState) throws {
        try db.defineFunction("backhaul_webhooks_changed") { state.sessionsWithWebhooks = nil }
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
