import CMicroHTTPD
import Glibc

/// Why the daemon could not start.
public struct MicroHTTPError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

/// An HTTP server on libmicrohttpd (`MHD_start_daemon`), the one place that sees `MHD_Connection`.
public final class Daemon: @unchecked Sendable {
    // @unchecked: `pointer` is set once in init and cleared in stop(), which callers serialise.
    public enum Threading: Sendable {
        /// A pool of polling threads (epoll); handlers must not block.
        case threadPool(Int)
        /// One thread per connection; handlers and streams may block.
        case threadPerConnection
    }

    private var pointer: OpaquePointer?
    private let context: Unmanaged<HandlerBox>
    public let port: UInt16
    public let host: String

    /// Binds `host:port` (port 0 picks a free one) and starts serving.
    public init(
        host: String, port: UInt16, threading: Threading = .threadPool(2),
        connectionTimeoutSeconds: UInt32 = 60, connectionLimit: UInt32 = 1024,
        handler: any StreamingHTTPHandler
    ) throws(MicroHTTPError) {
        let box = Unmanaged.passRetained(HandlerBox(handler))
        var flags = MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_ITC.rawValue
        var poolSize: UInt32 = 0
        switch threading {
        case .threadPool(let count):
            flags |= MHD_USE_EPOLL.rawValue
            poolSize = UInt32(max(count, 1))
        case .threadPerConnection:
            flags |= MHD_USE_THREAD_PER_CONNECTION.rawValue | MHD_USE_POLL.rawValue
        }
        var storage = sockaddr_storage()
        let isIPv6 = host.contains(":")
        if isIPv6 { flags |= MHD_USE_IPv6.rawValue }
        let parsed: Bool = withUnsafeMutableBytes(of: &storage) { raw in
            if isIPv6 {
                let address = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)
                address.pointee.sin6_family = sa_family_t(AF_INET6)
                address.pointee.sin6_port = port.bigEndian
                return inet_pton(AF_INET6, host, &address.pointee.sin6_addr) == 1
            } else {
                let address = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)
                address.pointee.sin_family = sa_family_t(AF_INET)
                address.pointee.sin_port = port.bigEndian
                return inet_pton(AF_INET, host, &address.pointee.sin_addr) == 1
            }
        }
        guard parsed else {
            box.release()
            throw MicroHTTPError(message: "not a numeric IP address: \(host)")
        }
        let started = withUnsafePointer(to: &storage) { storagePointer in
            storagePointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bh_mhd_start(
                    flags, port, address, poolSize, connectionTimeoutSeconds, connectionLimit,
                    accessHandler, completedHandler, box.toOpaque())
            }
        }
        guard let started else {
            box.release()
            throw MicroHTTPError(message: "cannot listen on \(host):\(port): \(String(cString: strerror(errno)))")
        }
        pointer = started
        context = box
        self.host = host
        self.port = bh_mhd_bound_port(started)
    }

    deinit {
        stop()
        context.release()
    }

    /// Stops accepting new connections (`MHD_quiesce_daemon`); open ones are still served.
    public func quiesce() {
        guard let pointer else { return }
        let socket = MHD_quiesce_daemon(pointer)
        if socket >= 0 { close(socket) }
    }

    /// Closes every connection and joins the threads (`MHD_stop_daemon`).
    public func stop() {
        guard let pointer else { return }
        self.pointer = nil
        MHD_stop_daemon(pointer)
    }
}

private final class HandlerBox {
    let handler: any StreamingHTTPHandler
    init(_ handler: any StreamingHTTPHandler) { self.handler = handler }
}

/// One request in flight, kept in MHD's per-request pointer (`con_cls`).
private final class RequestState {
    let consumer: any RequestBodyConsumer
    var answered = false
    init(consumer: any RequestBodyConsumer) { self.consumer = consumer }
}

private final class HeaderCollector {
    var values: [String: String] = [:]
    let lowercaseKeys: Bool
    init(lowercaseKeys: Bool) { self.lowercaseKeys = lowercaseKeys }
}

private func collect(_ connection: OpaquePointer, kind: MHD_ValueKind, lowercaseKeys: Bool) -> [String: String] {
    let collector = HeaderCollector(lowercaseKeys: lowercaseKeys)
    withExtendedLifetime(collector) {
        _ = MHD_get_connection_values(
            connection, kind,
            { cls, _, key, value in
                let collector = Unmanaged<HeaderCollector>.fromOpaque(cls!).takeUnretainedValue()
                guard let key else { return MHD_Result.YES }
                var name = String(cString: key)
                if collector.lowercaseKeys { name = name.lowercased() }
                let text = value.map { String(cString: $0) } ?? ""
                if let existing = collector.values[name], collector.lowercaseKeys {
                    collector.values[name] = existing + ", " + text
                } else {
                    collector.values[name] = text
                }
                return MHD_Result.YES
            }, Unmanaged.passUnretained(collector).toOpaque())
    }
    return collector.values
}

/// The access handler trampoline: called for the head, for each body piece, and once at the end.
private let accessHandler: bh_mhd_access_handler = { cls, connection, url, method, _, uploadData, uploadSize, conCls in
    guard let cls, let connection, let conCls, let uploadSize else { return MHD_Result.NO }
    guard let existing = conCls.pointee else {
        let box = Unmanaged<HandlerBox>.fromOpaque(cls).takeUnretainedValue()
        let head = HTTPRequestHead(
            method: method.map { String(cString: $0) } ?? "GET",
            path: url.map { String(cString: $0) } ?? "/",
            query: collect(connection, kind: .GET_ARGUMENT_KIND, lowercaseKeys: false),
            headers: collect(connection, kind: .HEADER_KIND, lowercaseKeys: true))
        let state = RequestState(consumer: box.handler.begin(head))
        conCls.pointee = Unmanaged.passRetained(state).toOpaque()
        return MHD_Result.YES
    }
    let state = Unmanaged<RequestState>.fromOpaque(existing).takeUnretainedValue()
    if uploadSize.pointee > 0 {
        let count = uploadSize.pointee
        uploadSize.pointee = 0
        if state.answered { return MHD_Result.YES }  // discard what follows an early answer
        switch state.consumer.consume(UnsafeRawBufferPointer(start: uploadData, count: count)) {
        case .continue: return MHD_Result.YES
        case .drop: return MHD_Result.NO
        case .respond(let response):
            state.answered = true
            return queue(response, on: connection)
        }
    }
    if state.answered { return MHD_Result.YES }
    state.answered = true
    let trailers = collect(connection, kind: .FOOTER_KIND, lowercaseKeys: true)
    if !trailers.isEmpty { state.consumer.receivedTrailers(trailers) }
    guard let response = state.consumer.finish() else { return MHD_Result.NO }
    return queue(response, on: connection)
}

private let completedHandler: bh_mhd_completed_handler = { _, _, conCls, _ in
    guard let conCls, let state = conCls.pointee else { return }
    Unmanaged<RequestState>.fromOpaque(state).release()
    conCls.pointee = nil
}

private final class StreamBox {
    let stream: any ResponseStream
    init(_ stream: any ResponseStream) { self.stream = stream }
}

private func queue(_ response: HTTPResponse, on connection: OpaquePointer) -> MHD_Result {
    let mhdResponse: OpaquePointer?
    switch response.body {
    case .bytes(let bytes):
        mhdResponse = bytes.withUnsafeBytes { buffer in
            MHD_create_response_from_buffer(
                buffer.count, UnsafeMutableRawPointer(mutating: buffer.baseAddress),
                .RESPMEM_MUST_COPY)
        }
    case .stream(let stream):
        let box = Unmanaged.passRetained(StreamBox(stream)).toOpaque()
        mhdResponse = MHD_create_response_from_callback(
            bh_mhd_size_unknown(), 16 * 1024,
            { cls, _, buffer, max in
                let box = Unmanaged<StreamBox>.fromOpaque(cls!).takeUnretainedValue()
                switch box.stream.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: max)) {
                case .bytes(let count): return count
                case .end: return bh_mhd_content_reader_end_of_stream()
                case .error: return bh_mhd_content_reader_end_with_error()
                }
            }, box,
            { cls in
                Unmanaged<StreamBox>.fromOpaque(cls!).release()
            })
    }
    guard let mhdResponse else { return MHD_Result.NO }
    defer { MHD_destroy_response(mhdResponse) }
    for (name, value) in response.headers { MHD_add_response_header(mhdResponse, name, value) }
    return MHD_queue_response(connection, UInt32(response.status), mhdResponse)
}
