import BackhaulAPI
import Foundation
import JSONCodec
import Testing

@Suite("OpenAPI document")
struct OpenAPITests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    static let document = packageRoot + "/OpenAPI/backhaul.yaml"

    /// Runs python3 with `arguments`; its exit status and standard output.
    static func python(_ arguments: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3"] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test("is a valid OpenAPI 3.1 document (openapi-spec-validator)")
    func valid() throws {
        let (status, output) = try Self.python(["-m", "openapi_spec_validator", Self.document])
        #expect(status == 0, "\(output)")
    }

    @Test("lists exactly the routes of the route table")
    func matchesRoutes() throws {
        let script = """
            import json, sys, yaml
            spec = yaml.safe_load(open(sys.argv[1]))
            print(json.dumps(sorted(m.upper() + " " + p for p, ops in spec["paths"].items() for m in ops if m != "parameters")))
            """
        let (status, output) = try Self.python(["-c", script, Self.document])
        try #require(status == 0, "\(output)")
        let documented = try #require(try JSON.parse(output.trimmingCharacters(in: .whitespacesAndNewlines)).arrayValue)
            .compactMap(\.stringValue)
        let api = try APIHarness()
        let routed = api.router.routes.map { "\($0.method) \($0.pattern)" }.sorted()
        #expect(Set(documented) == Set(routed))
    }
}
