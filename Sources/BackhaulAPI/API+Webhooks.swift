import BackhaulCore
import BackhaulQueue
import JSONCodec
import MicroHTTP

extension API {
    static let webhookFields: Set<String> = ["url", "events", "secret"]

    static func decodeEvents(_ reader: FieldReader) throws(ValidationError) -> [EventType]? {
        guard let value = reader.value("events") else { return nil }
        guard let items = value.arrayValue, !items.isEmpty, items.count <= EventType.allCases.count else {
            throw ValidationError(reader.field("events"), "must be a non-empty array of event types")
        }
        var events: [EventType] = []
        for item in items {
            guard let type = item.stringValue.flatMap(EventType.init(rawValue:)) else {
                throw ValidationError(
                    reader.field("events"),
                    "must name event types among \(EventType.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            if !events.contains(type) { events.append(type) }
        }
        return events
    }

    static func decodeWebhookURL(_ reader: FieldReader) throws(ValidationError) -> String? {
        guard let url = try reader.string("url", maxLength: 4096) else { return nil }
        guard URLParts(url) != nil else { throw ValidationError(reader.field("url"), "must be an absolute http or https URL") }
        return url
    }

    static func decodeSecret(_ reader: FieldReader) throws(ValidationError) -> String? {
        guard let secret = try reader.string("secret", maxLength: 256) else { return nil }
        guard WebhookRecord.key(of: secret) != nil else {
            throw ValidationError(reader.field("secret"), "must be whsec_ followed by base64 of 16 to 128 bytes")
        }
        return secret
    }

    func existingWebhook(_ request: RouteRequest) throws(Problem) -> WebhookRecord {
        let id = request.parameter("id")
        guard let webhook = try stored({ () throws(StoreError) in try store.webhook(id: id) }) else {
            throw Problem(.notFound, "no webhook \(id)")
        }
        return webhook
    }

    func checkWebhookDestination(_ url: String) throws(Problem) {
        if let refusal = options.destinations.refusal(url, for: .webhook) {
            throw Problem(.destinationNotAllowed, "url: \(refusal)", extra: ["field": "url"])
        }
    }

    @Sendable func createWebhook(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let sessionID = try sessionID(request)
        let value = try body(request)
        let now = clock.now()
        let webhook = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(API.webhookFields)
            guard let url = try API.decodeWebhookURL(reader) else { throw ValidationError("url", "is required") }
            try checkWebhookDestination(url)
            return WebhookRecord(
                id: RandomID.make(prefix: "wh_", at: now), sessionID: sessionID, url: url,
                events: try API.decodeEvents(reader) ?? EventType.defaultSubscription,
                secret: try API.decodeSecret(reader) ?? WebhookRecord.generateSecret(), createdAt: now)
        }
        try stored { () throws(StoreError) in try store.createWebhook(webhook) }
        return API.json(201, webhook.json(showingSecret: true))
    }

    @Sendable func listWebhooks(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let sessionID = try sessionID(request)
        guard try stored({ () throws(StoreError) in try store.session(id: sessionID) }) != nil else {
            throw Problem(.notFound, "no session \(sessionID)")
        }
        let webhooks = try stored { () throws(StoreError) in try store.webhooks(sessionID: sessionID) }
        return API.json(200, ["webhooks": .array(webhooks.map { $0.json() })])
    }

    @Sendable func getWebhook(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.json(200, try existingWebhook(request).json())
    }

    @Sendable func patchWebhook(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let current = try existingWebhook(request)
        let value = try body(request)
        let updated = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["url", "events", "enabled"])
            let url = try API.decodeWebhookURL(reader)
            if let url { try checkWebhookDestination(url) }
            let events = try API.decodeEvents(reader)
            let enabled = try reader.bool("enabled")
            return try store.updateWebhook(id: current.id) { webhook in
                if let url { webhook.url = url }
                if let events { webhook.events = events }
                if let enabled { webhook.enabled = enabled }
            }
        }
        return API.json(200, updated.json())
    }

    @Sendable func deleteWebhook(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        try stored { () throws(StoreError) in try store.deleteWebhook(id: id) }
        return HTTPResponse(status: 204)
    }

    /// A new secret (given or generated); the old one keeps signing beside it for `grace_seconds`.
    @Sendable func rotateWebhookSecret(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let current = try existingWebhook(request)
        let value = request.http.body.isEmpty ? JSON.object([:]) : try body(request)
        let now = clock.now()
        let rotated = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["secret", "grace_seconds"])
            let secret = try API.decodeSecret(reader) ?? WebhookRecord.generateSecret()
            let grace = try reader.number("grace_seconds", in: 0...604_800) ?? 86_400
            return try store.updateWebhook(id: current.id) { webhook in
                webhook.previousSecret = webhook.secret
                webhook.previousSecretExpiresAt = now + grace
                webhook.secret = secret
            }
        }
        return API.json(200, rotated.json(showingSecret: true))
    }

    @Sendable func listDeliveries(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let webhook = try existingWebhook(request)
        var state: DeliveryRecord.State?
        if let name = request.http.query["state"] {
            guard let parsed = DeliveryRecord.State(rawValue: name) else {
                throw Problem(
                    .validationFailed, "state must be pending, delivered, failed or abandoned", extra: ["field": "state"])
            }
            state = parsed
        }
        let (limit, cursor) = try page(request)
        let page = try stored { () throws(StoreError) in
            try store.deliveries(webhookID: webhook.id, state: state, cursor: cursor, limit: limit)
        }
        return API.json(
            200,
            [
                "deliveries": .array(page.deliveries.map(\.json)),
                "next_cursor": page.nextCursor.map { .string($0) } ?? .null,
            ])
    }

    /// `GET /v1/events`: the live stream, from `Last-Event-ID` (or `?after=`), else from now.
    @Sendable func events(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        guard let feed = eventFeed else { throw Problem(.unavailable, "the event stream is not available") }
        var session: String?
        if let name = request.http.query["session"] {
            guard SessionRecord.isValidID(name) else {
                throw Problem(.validationFailed, "session is not a session id", extra: ["field": "session"])
            }
            session = name
        }
        var visible: (@Sendable (String) -> Bool)?
        if let principal = request.principal, principal != .admin {
            // A client sees only its own sessions' events: the one it names, or all of them.
            if let session, !principal.canAccess(session: session) {
                throw Problem(.forbidden, "this token may not stream the session \(session)")
            }
            visible = { principal.canAccess(session: $0) }
        }
        let resume = request.http.header("last-event-id") ?? request.http.query["after"]
        let cursor: Int64
        if let resume {
            guard let parsed = Int64(resume), parsed >= 0 else {
                throw Problem(
                    .validationFailed, "Last-Event-ID is an event id this stream gave out", extra: ["field": "Last-Event-ID"])
            }
            cursor = parsed
        } else {
            cursor = try stored { () throws(StoreError) in try store.lastEventSequence() }
        }
        let stream = EventStream(store: store, feed: feed, session: session, visible: visible, after: cursor)
        return HTTPResponse(
            status: 200,
            headers: [
                ("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                ("X-Accel-Buffering", "no"),
            ], stream: stream)
    }
}
