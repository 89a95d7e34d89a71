import BackhaulCore
import Threads

/// API requests by route pattern, method and status, with latency histograms per route, for
/// `/metrics`. Labels come from closed sets: the route table's patterns (or `unmatched`), the
/// HTTP methods the API knows (others count as `other`), status codes.
public final class RequestMetrics: Sendable {
    public static let buckets: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]
    static let methods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]

    struct Histogram {
        var counts = [Int](repeating: 0, count: RequestMetrics.buckets.count)
        var sum = 0.0
        var count = 0
    }

    struct Key: Hashable {
        var route: String
        var method: String
        var status: Int
    }

    private struct State {
        var requests: [Key: Int] = [:]
        var latency: [String: Histogram] = [:]
    }

    private let state = Locked(State())

    public init() {}

    public func record(route: String, method: String, status: Int, seconds: Double) {
        let method = Self.methods.contains(method) ? method : "other"
        state.withLock { state in
            state.requests[Key(route: route, method: method, status: status), default: 0] += 1
            var histogram = state.latency[route] ?? Histogram()
            for (index, bound) in Self.buckets.enumerated() where seconds <= bound { histogram.counts[index] += 1 }
            histogram.sum += seconds
            histogram.count += 1
            state.latency[route] = histogram
        }
    }

    func write(to text: inout PrometheusText) {
        let (requests, latency) = state.withLock { ($0.requests, $0.latency) }
        text.family("backhaul_http_requests_total", "counter", "API requests by route pattern, method and status.")
        for (key, count) in requests.sorted(by: {
            ($0.key.route, $0.key.method, $0.key.status) < ($1.key.route, $1.key.method, $1.key.status)
        }) {
            text.sample(
                "backhaul_http_requests_total", ["route": key.route, "method": key.method, "status": String(key.status)],
                Double(count))
        }
        text.family("backhaul_http_request_duration_seconds", "histogram", "API request latency by route pattern.")
        for (route, histogram) in latency.sorted(by: { $0.key < $1.key }) {
            for (index, bound) in Self.buckets.enumerated() {
                text.sample(
                    "backhaul_http_request_duration_seconds_bucket", ["route": route, "le": String(bound)],
                    Double(histogram.counts[index]))
            }
            text.sample("backhaul_http_request_duration_seconds_bucket", ["route": route, "le": "+Inf"], Double(histogram.count))
            text.sample("backhaul_http_request_duration_seconds_sum", ["route": route], histogram.sum)
            text.sample("backhaul_http_request_duration_seconds_count", ["route": route], Double(histogram.count))
        }
    }
}
