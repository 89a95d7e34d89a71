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

    /// The answer's JSON for a 2xx; a problem's detail as a `CLIError` otherwise.
    @discardableResult
    public func call(_ method: String, _ path: String, _ body: JSON? = nil) throws(CLIError) -> JSON {
        let exchange: HTTPExchange
        do {
            exchange = try http.send(method, base + path, headers: token.map { ["Authorization: Bearer \($0)"] } ?? [],
                                     body: body?.serializedBytes())
        } catch {
            throw CLIError(status: .unreachable, description: "cannot reach backhauld at \(base): \(error)")
        }
        let value = (try? JSON.parse(exchange.body, maxDepth: 64)) ?? .null
        guard (200..<300).contains(exchange.status) else {
            let detail = value["detail"]?.stringValue ?? "HTTP \(exchange.status)"
            let code = value["code"]?.stringValue.map { " (\($0))" } ?? ""
            throw CLIError(status: .refused, description: "\(detail)\(code)")
        }
        return value
    }
}
