import MicroHTTP

/// A matched request: the request and its path parameters.
public struct RouteRequest: Sendable {
    public var http: HTTPRequest
    public var parameters: [String: String]
    /// The caller, when tokens are on (nil: tokens are off, loopback only, everything allowed).
    public var principal: Principal?

    public func parameter(_ name: String) -> String { parameters[name] ?? "" }
}

/// A route: method, pattern with `{name}` segments, handler.
public struct Route: Sendable {
    public var method: String
    public var pattern: String
    public var handler: @Sendable (RouteRequest) throws(Problem) -> HTTPResponse
    public var access: Access
    let segments: [Substring]

    public init(
        _ method: String, _ pattern: String, _ access: Access,
        _ handler: @escaping @Sendable (RouteRequest) throws(Problem) -> HTTPResponse
    ) {
        self.method = method
        self.pattern = pattern
        self.access = access
        self.handler = handler
        self.segments = pattern.split(separator: "/", omittingEmptySubsequences: true)
    }

    func match(_ path: [Substring]) -> [String: String]? {
        guard path.count == segments.count else { return nil }
        var parameters: [String: String] = [:]
        for (pattern, value) in zip(segments, path) {
            if pattern.hasPrefix("{") {
                parameters[String(pattern.dropFirst().dropLast())] = String(value)
            } else if pattern != value {
                return nil
            }
        }
        return parameters
    }
}

/// Dispatches requests to the route table; 404 and 405 as problems.
public struct Router: Sendable {
    public let routes: [Route]
    /// Checks the caller against a route's `Access` and returns who it is; nil when tokens are off.
    let authorize: @Sendable (Route, RouteRequest) throws(Problem) -> Principal?

    public init(
        routes: [Route], authorize: @escaping @Sendable (Route, RouteRequest) throws(Problem) -> Principal? = { _, _ in nil }
    ) {
        self.routes = routes
        self.authorize = authorize
    }

    /// The handler's answer, and the matched pattern (for logs and metrics).
    public func handle(_ request: HTTPRequest) -> (HTTPResponse, String) {
        let path = request.path.split(separator: "/", omittingEmptySubsequences: true)
        var allowed: [String] = []
        for route in routes {
            guard let parameters = route.match(path) else { continue }
            guard route.method == request.method || (request.method == "HEAD" && route.method == "GET") else {
                allowed.append(route.method)
                continue
            }
            do {
                var matched = RouteRequest(http: request, parameters: parameters)
                matched.principal = try authorize(route, matched)
                return (try route.handler(matched), route.pattern)
            } catch {
                return (error.response, route.pattern)
            }
        }
        if !allowed.isEmpty {
            let problem = Problem(
                .methodNotAllowed, "\(request.method) is not allowed here; use \(allowed.joined(separator: ", "))",
                extra: ["allow": .string(allowed.joined(separator: ", "))])
            return (problem.response, "unmatched")
        }
        return (Problem(.notFound, "no resource at \(request.path)").response, "unmatched")
    }
}
