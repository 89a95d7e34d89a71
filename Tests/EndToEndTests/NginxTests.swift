import BackhaulTesting
import Foundation
import JSON
import Testing

extension EndToEndTests {
    @Test("raw uploads to nginx (WebDAV PUT) arrive byte-exact over reused connections")
    func nginxUploads() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        try fixture.session()
        var ids: [String: String] = [:]
        ids["big.bin"] = try fixture.enqueue(
            fixture.makeFile("big.bin", size: 24 << 20),
            extra: [
                "request": ["url": .string(nginx.url("/in/big.bin"))]
            ])
        for index in 0..<20 {
            let name = "small-\(index).bin"
            ids[name] = try fixture.enqueue(
                fixture.makeFile(name, size: 50_000 + index),
                extra: [
                    "request": ["url": .string(nginx.url("/in/\(name)"))]
                ])
        }
        for (name, id) in ids {
            let task = try fixture.daemon.waitForTask(id, timeout: 60)
            fixture.expectLog(task["state"]?.stringValue == "completed", "\(name): \(task.serialized())")
            #expect(task["response"]?["status"]?.intValue == 201)
            #expect(
                Bytes(fixture.contents(nginx.root + "/in/" + name)) == Bytes(fixture.contents(fixture.data + "/" + name)),
                "\(name)")
        }
    }
}
