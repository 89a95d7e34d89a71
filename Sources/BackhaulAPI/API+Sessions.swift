import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import JSONCodec
import Logging
import MicroHTTP

/// Sessions (OpenAPI/backhaul.yaml): create, read, change, finish or cancel.
extension API {
    @Sendable func listSessions(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let sessions = try stored { () throws(StoreError) in try store.sessions() }
            .filter { request.principal?.canAccess(session: $0.0.id) ?? true }
        return API.json(200, ["sessions": .array(sessions.map { $0.0.json(taskCounts: $0.1) })])
    }

    /// A signer named without a secret gets a new one, which the answer shows once (as a
    /// webhook's at its creation); the signer's URL must be a destination webhooks may reach.
    func fillSignerSecret(_ body: JSON) throws(Problem) -> (JSON, String?) {
        guard case .object(var object) = body, case .object(var configuration)? = object["configuration"],
            case .object(var signer)? = configuration["signer"]
        else { return (body, nil) }
        if let url = signer["url"]?.stringValue, URLParts(url) != nil,
            let refusal = options.destinations.refusal(url, for: .webhook)
        {
            throw Problem(
                .destinationNotAllowed, "configuration.signer.url: \(refusal)", extra: ["field": "configuration.signer.url"])
        }
        let secret = signer["secret"]?.stringValue ?? WebhookRecord.generateSecret()
        if signer["secret"] == nil || signer["secret"] == .null { signer["secret"] = .string(secret) }
        configuration["signer"] = .object(signer)
        object["configuration"] = .object(configuration)
        return (.object(object), secret)
    }

    /// The session as the API shows it, with the signer's secret when this request set it.
    static func sessionAnswer(_ session: SessionRecord, _ counts: [TaskState: Int], signerSecret: String?) -> JSON {
        var shown = session.json(taskCounts: counts)
        guard let signerSecret, case .object(var object) = shown, case .object(var configuration)? = object["configuration"],
            case .object(var signer)? = configuration["signer"]
        else { return shown }
        signer["secret"] = .string(signerSecret)
        configuration["signer"] = .object(signer)
        object["configuration"] = .object(configuration)
        shown = .object(object)
        return shown
    }

    @Sendable func putSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        let (value, signerSecret) = try fillSignerSecret(try body(request))
        let configuration = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["configuration"])
            return try TransferConfiguration().applying(reader.value("configuration") ?? .object([:]))
        }
        let (session, created) = try stored { () throws(StoreError) in try store.putSession(id: id, configuration: configuration)
        }
        let counts = try stored { () throws(StoreError) in try store.session(id: id)?.1 ?? [:] }
        return API.json(created ? 201 : 200, API.sessionAnswer(session, counts, signerSecret: signerSecret))
    }

    @Sendable func getSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard let (session, counts) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            throw Problem(.notFound, "no session \(id)")
        }
        return API.json(200, session.json(taskCounts: counts))
    }

    @Sendable func patchSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        let (value, signerSecret) = try fillSignerSecret(try body(request))
        let (patch, enabled, cancelPending) = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["configuration", "enabled", "cancel_pending"])
            let enabled = try reader.bool("enabled")
            let cancelPending = try reader.bool("cancel_pending") ?? false
            if cancelPending, enabled != false {
                throw ValidationError("cancel_pending", "goes with \"enabled\": false")
            }
            // Checked here against the defaults, so a malformed body is refused before the store
            // is touched; merged with the stored configuration inside the write transaction.
            let patch = reader.value("configuration")
            if let patch { _ = try TransferConfiguration().applying(patch) }
            return (patch, enabled, cancelPending)
        }
        let (session, counts) = try stored { () throws(StoreError) in
            try store.updateSession(id: id, cancelPending: cancelPending) { current in
                (try patch.map { try current.configuration.applying($0) }, enabled)
            }
        }
        return API.json(200, API.sessionAnswer(session, counts, signerSecret: signerSecret))
    }

    @Sendable func deleteSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        let mode = request.http.query["mode"] ?? "finish"
        guard mode == "finish" || mode == "cancel" else {
            throw Problem(.validationFailed, "mode must be finish or cancel", extra: ["field": "mode"])
        }
        let removed = try stored { () throws(StoreError) in try store.deleteSession(id: id, cancel: mode == "cancel") }
        if removed { return HTTPResponse(status: 204) }
        guard let (session, counts) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            return HTTPResponse(status: 204)
        }
        return API.json(202, session.json(taskCounts: counts))
    }
}
