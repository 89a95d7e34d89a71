import BackhaulClient
import Testing

@Suite("Server-sent events parser")
struct ServerSentEventsTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var stream: String
        var events: [ServerSentEvent]
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(
            name: "the daemon's framing", stream: "retry: 2000\n: connected\n\nid: 7\nevent: task.progress\ndata: {\"a\":1}\n\n",
            events: [ServerSentEvent(id: "7", type: "task.progress", data: "{\"a\":1}")]),
        Case(name: "comments and keep-alives dispatch nothing", stream: ": keep-alive\n\n: x\n\n", events: []),
        Case(name: "data lines join with newlines", stream: "data: a\ndata: b\n\n", events: [ServerSentEvent(data: "a\nb")]),
        Case(
            name: "one space after the colon is dropped, no more", stream: "data:x\n\ndata:  y\n\n",
            events: [ServerSentEvent(data: "x"), ServerSentEvent(data: " y")]),
        Case(
            name: "CR LF and CR end lines too", stream: "id: 1\r\ndata: a\r\n\r\nid: 2\rdata: b\r\r",
            events: [ServerSentEvent(id: "1", data: "a"), ServerSentEvent(id: "2", data: "b")]),
        Case(
            name: "the last id carries over; the type does not", stream: "id: 5\nevent: task.started\ndata: a\n\ndata: b\n\n",
            events: [ServerSentEvent(id: "5", type: "task.started", data: "a"), ServerSentEvent(id: "5", data: "b")]),
        Case(
            name: "an event without data is not dispatched", stream: "event: task.started\n\ndata: z\n\n",
            events: [ServerSentEvent(data: "z")]),
        Case(name: "an unfinished event waits for its blank line", stream: "data: half\n", events: []),
        Case(
            name: "unknown fields and a bare field name", stream: "retry: 10\nfoo: bar\ndata\n\n",
            events: [ServerSentEvent(data: "")]),
    ]

    @Test("events from a whole stream", arguments: cases)
    func whole(_ example: Case) {
        var parser = ServerSentEventParser()
        #expect(parser.feed(Array(example.stream.utf8)) == example.events)
    }

    @Test("the same events when the bytes arrive one at a time", arguments: cases)
    func byteByByte(_ example: Case) {
        var parser = ServerSentEventParser()
        let events = Array(example.stream.utf8).flatMap { parser.feed([$0]) }
        #expect(events == example.events)
    }
}
