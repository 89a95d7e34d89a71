import Digest

/// The dashboard (docs/dashboard.md): a page, its stylesheet, its script (ES modules) and its icon,
/// embedded in the binary at build time (`Assets/`, SwiftPM's `embedInCode`). Nothing is read
/// from disk and nothing is fetched from another host; the page talks only to the API it came from.
public enum Dashboard {
    /// One file of the page, ready to serve.
    public struct Asset: Sendable {
        public let name: String
        public let contentType: String
        public let bytes: [UInt8]
        /// A strong validator: the first 128 bits of the bytes' SHA-256, quoted.
        public let etag: String

        init(name: String, contentType: String, bytes: [UInt8]) {
            self.name = name
            self.contentType = contentType
            self.bytes = bytes
            etag = "\"" + SHA256Hasher.hex(Array(SHA256Hasher.digest(bytes).prefix(16))) + "\""
        }
    }

    /// `GET /`.
    public static let page = Asset(
        name: "index.html", contentType: "text/html; charset=utf-8", bytes: PackageResources.index_html)

    /// `GET /ui/{name}`.
    public static let files: [String: Asset] = [
        "app.css": Asset(name: "app.css", contentType: "text/css; charset=utf-8", bytes: PackageResources.app_css),
        "icon.svg": Asset(name: "icon.svg", contentType: "image/svg+xml", bytes: PackageResources.icon_svg),
        "app.js": script("app.js", PackageResources.app_js),
        "api.js": script("api.js", PackageResources.api_js),
        "stream.js": script("stream.js", PackageResources.stream_js),
        "snapshots.js": script("snapshots.js", PackageResources.snapshots_js),
        "view.js": script("view.js", PackageResources.view_js),
        "panels.js": script("panels.js", PackageResources.panels_js),
        "actions.js": script("actions.js", PackageResources.actions_js),
        "words.js": script("words.js", PackageResources.words_js),
        "page.js": script("page.js", PackageResources.page_js),
    ]

    /// One of the script's files: `app.js`, which the page loads as an ES module, and the modules
    /// it imports (`import … from './view.js'`, so `/ui/view.js`).
    private static func script(_ name: String, _ bytes: [UInt8]) -> Asset {
        Asset(name: name, contentType: "text/javascript; charset=utf-8", bytes: bytes)
    }

    /// Every byte the dashboard ships.
    public static var totalBytes: Int { page.bytes.count + files.values.reduce(0) { $0 + $1.bytes.count } }

    /// The page's Content-Security-Policy: its own origin only, no inline script or style, no
    /// frames, no form posts (the script sends everything with `fetch`).
    public static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}
