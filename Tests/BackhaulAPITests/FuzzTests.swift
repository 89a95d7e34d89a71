import BackhaulAPI
import BackhaulCore
import JSONCodec
import MicroHTTP
import Testing

/// Property tests of the decoding path: seeded mutations of valid documents (bytes flipped,
/// inserted, deleted, spliced; NULs, invalid UTF-8, deep nesting, huge numbers) go through the
/// JSON parser and through the API's handlers. Nothing may crash; the parser either refuses or
/// gives a value that survives a round trip; the API answers every one with a 2xx or a 4xx
/// problem+json, never a 5xx.
@Suite("Fuzzing the decoding path")
struct FuzzTests {
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            var value = state
            value ^= value >> 33
            return value
        }
    }

    static let corpus: [String] = [
        #"{"file": "/tmp/a", "request": {"url": "http://127.0.0.1:9/x", "method": "PUT", "headers": {"Authorization": "Bearer t"}}}"#,
        #"{"tasks": [{"file": "/tmp/a", "request": {"url": "http://h/x"}, "upload": {"protocol": "chunked", "chunk_size": 1048576}}]}"#,
        #"{"configuration": {"retry": {"max_attempts": 3, "initial_backoff": 0.5}, "default_headers": {"X-A": "b"}}}"#,
        #"{"upload": {"protocol": "s3", "checksum": "sha256"}, "s3": {"region": "eu-west-1", "access_key_id": "A", "secret_access_key": "s"}}"#,
        #"{"bandwidth_limit": 2097152, "discretionary_window": {"from": "22:00", "to": "06:00"}, "discretionary_daily_budget": {"wifi": 1e10}}"#,
        #"[1, -2.5e300, 1e400, 123456789012345678901234567890, true, false, null, "\u00e9\ud83d\ude00", "\u0000"]"#,
    ]

    static let fragments: [[UInt8]] = [
        [0], [0xFF], [0xC3], [0xED, 0xA0, 0x80], Array("\\u0000".utf8), Array("\\ud800".utf8), Array("1e999999".utf8),
        Array("-0".utf8), Array("[[[[[[[[[[".utf8), Array("{\"a\":".utf8), Array("\"".utf8), Array("}".utf8), Array("'".utf8),
        Array("NaN".utf8), Array("Infinity".utf8), Array("99999999999999999999".utf8), Array(",".utf8), Array("\\".utf8),
    ]

    static func mutate(_ input: [UInt8], _ random: inout Generator) -> [UInt8] {
        var bytes = input
        for _ in 0..<Int.random(in: 1...4, using: &random) {
            let position = bytes.isEmpty ? 0 : Int.random(in: 0..<bytes.count, using: &random)
            switch Int.random(in: 0..<5, using: &random) {
            case 0 where !bytes.isEmpty: bytes[position] = UInt8.random(in: 0...255, using: &random)
            case 1 where !bytes.isEmpty: bytes.remove(at: position)
            case 2: bytes.insert(contentsOf: fragments.randomElement(using: &random)!, at: position)
            case 3 where !bytes.isEmpty:
                bytes = Array(bytes[..<position]) + Array(bytes[position...].prefix(Int.random(in: 0...8, using: &random)))
            default:
                bytes.insert(
                    contentsOf: Array(repeating: UInt8(ascii: "["), count: Int.random(in: 1...200, using: &random)), at: position)
            }
        }
        return bytes
    }

    @Test("20,000 mutated documents: the parser refuses or round-trips, never crashes")
    func parser() {
        var random = Generator(state: 42)
        var parsed = 0
        for round in 0..<20_000 {
            let input = Self.mutate(Array(Self.corpus[round % Self.corpus.count].utf8), &random)
            guard let value = try? JSON.parse(input, maxDepth: 32) else { continue }
            parsed += 1
            #expect(
                (try? JSON.parse(value.serializedBytes(), maxDepth: 32)) == value,
                "\(String(decoding: input, as: UTF8.self)) -> \(value.serialized())")
        }
        print("fuzz: 20000 mutated documents, \(parsed) parsed and round-tripped, the rest refused")
        #expect(parsed > 0)
    }

    /// `/v1/network` and `/v1/policy` need the engine: schemathesis covers them on the live daemon.
    @Test("5,000 mutated request bodies to the write endpoints: 2xx or a 4xx problem, never a 5xx")
    func api() throws {
        let harness = try APIHarness()
        #expect(harness.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        let task = try #require(harness.call("POST", "/v1/sessions/s/tasks", harness.task()).1["id"]?.stringValue)
        let webhook = try #require(
            harness.call("POST", "/v1/sessions/s/webhooks", ["url": "http://127.0.0.1:9/h"]).1["id"]?.stringValue)
        // Existing resources only, so every body reaches its handler's decoding.
        let targets: [(String, String)] = [
            ("POST", "/v1/sessions/s/tasks"), ("PUT", "/v1/sessions/t"), ("PATCH", "/v1/sessions/s"),
            ("POST", "/v1/sessions/s/webhooks"), ("PATCH", "/v1/tasks/\(task)"), ("PATCH", "/v1/webhooks/\(webhook)"),
            ("POST", "/v1/webhooks/\(webhook)/rotate"),
        ]
        var random = Generator(state: 7)
        var statuses: [Int: Int] = [:]
        for round in 0..<5_000 {
            var seed = Array(Self.corpus[round % Self.corpus.count].utf8)
            if round % 3 == 0 { seed = Array(harness.task().serialized().utf8) }
            let body = Self.mutate(seed, &random)
            let (method, path) = targets[round % targets.count]
            let (response, _) = harness.router.handle(HTTPRequest(method: method, path: path, query: [:], body: body))
            statuses[response.status, default: 0] += 1
            #expect(response.status < 500, "\(method) \(path) answered \(response.status) to \(body)")
            if response.status >= 400 {
                #expect(response.headers.contains { $0.0 == "Content-Type" && $0.1 == "application/problem+json" })
            }
        }
        print("fuzz: 5000 mutated API bodies, statuses \(statuses.sorted { $0.key < $1.key })")
        #expect(statuses[404] == nil, "every target exists, so no body was turned away unread")
    }
}

@Suite("Request limits")
struct LimitTests {
    @Test("more than 100 headers, or a header value over 8 KiB, is refused with the field")
    func headerLimits() throws {
        let harness = try APIHarness()
        #expect(harness.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        var many = JSONObject()
        for index in 0..<101 { many["X-H\(index)"] = "v" }
        let tooMany = harness.call(
            "POST", "/v1/sessions/s/tasks", harness.task(["request": ["url": "http://127.0.0.1:9/x", "headers": .object(many)]]))
        #expect(tooMany.0 == 422 && tooMany.1["field"]?.stringValue == "request.headers")
        let huge = harness.call(
            "POST", "/v1/sessions/s/tasks",
            harness.task([
                "request": ["url": "http://127.0.0.1:9/x", "headers": ["X-Big": .string(String(repeating: "a", count: 8193))]]
            ]))
        #expect(huge.0 == 422 && huge.1["field"]?.stringValue == "request.headers.X-Big")
    }

    @Test(
        "a PATCH whose merged configuration is invalid is 422 naming the field, and changes nothing (found by the fuzz test: it was 500)"
    )
    func invalidPatchInsideTheTransaction() throws {
        let harness = try APIHarness()
        #expect(harness.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        let task = try #require(harness.call("POST", "/v1/sessions/s/tasks", harness.task()).1["id"]?.stringValue)
        let (status, problem, _) = harness.call("PATCH", "/v1/tasks/\(task)", ["configuration": ["speed": 1]])
        #expect(status == 422 && problem["code"]?.stringValue == "validation_failed")
        #expect(problem["field"]?.stringValue == "configuration.speed")
        #expect(harness.call("GET", "/v1/tasks/\(task)").1["configuration"] == .object([:]))
    }
}
