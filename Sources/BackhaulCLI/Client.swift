import Curl
import JSON

/// Exit codes scripts can rely on.
public enum ExitStatus: Int32, Sendable {
    case ok = 0
    /// The API refused the request (a problem+json answer).
    case refused = 1
    /// Bad command-line usage (ArgumentParser's own code).
    case usage = 64
    /// `--wait` saw the task end failed or cancelled.
    case taskUnsuccessful = 3
    /// The daemon could not be reached.
    case unreachable = 4
}

/// A failure that ends the command with an exit status and a message on stderr.
public struct CLIError: Error, CustomStringConvertible {
    public var status: ExitStatus
    public var description: String
}

/// The daemon's API over HTTP: `BACKHAUL_URL` (default http://127.0.0.1:8427) and
/// `BACKHAUL_TOKEN`, or the `--url` and `--token` flags.
public final class APIClient {
    let base: String
    let token: String?
    private let http: HTTPClient

    public init(url: String, token: String?) throws {
        base = url.hasSuffix("/") ? String(url.dropLast()) : url
        self.token = token
        http = try HTTPClient()
    }

    private var authorization: [String] { token.map { ["Authorization: Bearer \($0)"] } ?? [] }

    /// The answer's JSON for a 2xx; a problem's detail as a `CLIError` otherwise.
    @discardableResult
    public func call(_ method: String, _ path: String, _ body: JSON? = nil) throws(CLIError) -> JSON {
        let exchange: HTTPExchange
        do {
            exchange = try http.send(method, base + path, headers: authorization, body: body?.serializedBytes())
        } catch {
            throw unreachable(error)
        }
        return try Self.value(of: exchange)
    }

    /// Follows a server-sent event stream (`GET /v1/events…`), handing each event to `receive`
    /// until it or `tick` (called about once a second) returns false, or the stream ends. A stream
    /// that broke after it was open has ended too; only one that never opened is `.unreachable`.
    /// `lastEventID` resumes after that event. Returns the id of the last event received.
    public func follow(_ path: String, lastEventID: String? = nil, receive: @escaping (ServerSentEvent) -> Bool,
                       tick: @escaping () -> Bool) throws(CLIError) -> String? {
        var parser = ServerSentEventParser()
        var last = lastEventID
        var opened = false
        let headers = authorization + ["Accept: text/event-stream"] + (lastEventID.map { ["Last-Event-ID: \($0)"] } ?? [])
        // A handle of its own: `receive` and `tick` may call the API meanwhile.
        let exchange: HTTPExchange
        do {
            exchange = try HTTPClient().stream(base + path, headers: headers, receive: { bytes in
                opened = true
                for event in parser.feed(bytes) {
                    last = event.id ?? last
                    guard receive(event) else { return false }
                }
                return true
            }, tick: tick)
        } catch where opened {
            return last
        } catch {
            throw unreachable(error)
        }
        _ = try Self.value(of: exchange)
        return last
    }

    private func unreachable(_ error: CurlCode) -> CLIError {
        CLIError(status: .unreachable, description: "cannot reach backhauld at \(base): \(error)")
    }

    private static func value(of exchange: HTTPExchange) throws(CLIError) -> JSON {
        let value = (try? JSON.parse(exchange.body, maxDepth: 64)) ?? .null
        guard (200..<300).contains(exchange.status) else {
            let detail = value["detail"]?.stringValue ?? "HTTP \(exchange.status)"
            let code = value["code"]?.stringValue.map { " (\($0))" } ?? ""
            throw CLIError(status: .refused, description: "\(detail)\(code)")
        }
        return value
    }
}
