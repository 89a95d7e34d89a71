import BackhaulUI
import MicroHTTP

/// `GET /` and `GET /ui/{file}`: the dashboard's files (docs/dashboard.md). They are open like
/// `/healthz`: they hold no data, and the page asks for a token when the API wants one. Off with
/// `--no-ui` (the routes are then absent: 404).
extension API {
    @Sendable func dashboardPage(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.serve(Dashboard.page, request)
    }

    @Sendable func dashboardFile(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let name = request.parameter("file")
        guard let asset = Dashboard.files[name] else { throw Problem(.notFound, "the dashboard has no file \(name)") }
        return API.serve(asset, request)
    }

    /// The asset with its validator; 304 when the browser already holds these bytes. Every
    /// answer carries the page's security headers, so an asset opened on its own is as confined.
    static func serve(_ asset: Dashboard.Asset, _ request: RouteRequest) -> HTTPResponse {
        let headers: [(String, String)] = [
            ("ETag", asset.etag), ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", Dashboard.contentSecurityPolicy), ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
        ]
        if let tags = request.http.header("if-none-match"),
            tags.split(separator: ",").contains(where: { $0.trimmingSpaces() == asset.etag || $0.trimmingSpaces() == "*" })
        {
            return HTTPResponse(status: 304, headers: headers)
        }
        return HTTPResponse(status: 200, headers: [("Content-Type", asset.contentType)] + headers, body: asset.bytes)
    }
}

extension Substring {
    fileprivate func trimmingSpaces() -> Substring {
        var text = self
        while text.first == " " || text.first == "\t" { text.removeFirst() }
        while text.last == " " || text.last == "\t" { text.removeLast() }
        return text
    }
}

extension Route {
    /// The dashboard's routes, left out of the table with `--no-ui`.
    var isDashboard: Bool { pattern == "/" || pattern.hasPrefix("/ui/") }
}
