// A test peer for `upload.protocol: "ietf"`: Apple's server side of draft-ietf-httpbis-resumable-upload
// (`HTTPResumableUploadHandler` from swift-nio-extras, interop versions 3, 5 and 6) on 127.0.0.1,
// in front of a small handler that writes each upload to a folder.
//
//   IETFPeer --port P --dir DIR --log FILE [--origin URL] [--versions 3,5,6] [--timeout SECONDS]
//            [--want-digest] [--corrupt-at OFFSET]
//
// DIR/partial/  uploads being received (the bytes Apple's code handed on so far)
// DIR/uploads/  finished uploads, named after the last path segment of the creation request
// FILE          one JSON line per request: method, path, status, the informational statuses sent
//               before it, the body bytes received (`content_length`), the resumable-upload
//               request headers, whether the connection ended before the exchange did (`aborted`).
//
// --origin      the scheme and authority put in the upload resource URLs (default this peer's own
//               address; a proxy's when the daemon reaches the peer through one)
// --versions    interop versions this peer takes; a request naming another is answered 400 with
//               the newest it takes (what NIOResumableUpload itself does for versions it lacks)
// --timeout     how long an interrupted upload waits for its resumption (default 3600 s)
// --want-digest OPTIONS answers `Want-Repr-Digest: sha-256=10`, and a finished upload whose
//               `Repr-Digest` does not match the bytes received is refused (400) and not stored
// --corrupt-at  flips the byte at this offset of the upload on its way in (a damaged link)
import CPeerCrypto
import Glibc
import HTTPTypes
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOPosix
import NIOResumableUpload

struct Options {
    var port = 0
    var directory = ""
    var log = ""
    var origin: String?
    var versions: Set<Int> = [3, 5, 6]
    var timeout: Int64 = 3600
    var wantDigest = false
    var corruptAt: Int64 = -1

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var index = 1
        func value() -> String {
            index += 1
            guard index < arguments.count else { usage("\(arguments[index - 1]) needs a value") }
            return arguments[index]
        }
        while index < arguments.count {
            switch arguments[index] {
            case "--port": options.port = Int(value()) ?? 0
            case "--dir": options.directory = value()
            case "--log": options.log = value()
            case "--origin": options.origin = value()
            case "--versions": options.versions = Set(value().split(separator: ",").compactMap { Int($0) })
            case "--timeout": options.timeout = Int64(value()) ?? 3600
            case "--want-digest": options.wantDigest = true
            case "--corrupt-at": options.corruptAt = Int64(value()) ?? -1
            default: usage("unknown argument \(arguments[index])")
            }
            index += 1
        }
        if options.port == 0 || options.directory.isEmpty || options.log.isEmpty { usage("--port, --dir and --log are required") }
        return options
    }
}

func usage(_ message: String) -> Never {
    fputs("IETFPeer: \(message)\n", stderr)
    exit(64)
}

/// JSON lines appended to the log file, from any event loop.
final class LogFile: @unchecked Sendable {
    private let descriptor: Int32
    private let lock = NIOLock()

    init(path: String) {
        descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        if descriptor < 0 { usage("cannot open \(path)") }
    }

    func write(_ fields: [(String, JSONValue)]) {
        var line = "{" + fields.map { "\(quoted($0.0)):\($0.1.text)" }.joined(separator: ",") + "}\n"
        lock.withLock {
            line.withUTF8 { bytes in _ = Glibc.write(descriptor, bytes.baseAddress, bytes.count) }
        }
    }
}

enum JSONValue {
    case string(String?)
    case int(Int64?)
    case bool(Bool)
    case ints([Int])

    var text: String {
        switch self {
        case .string(let value): return value.map(quoted) ?? "null"
        case .int(let value): return value.map { String($0) } ?? "null"
        case .bool(let value): return value ? "true" : "false"
        case .ints(let values): return "[" + values.map { String($0) }.joined(separator: ",") + "]"
        }
    }
}

func quoted(_ text: String) -> String {
    var result = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": result += "\\\""
        case "\\": result += "\\\\"
        case _ where scalar.value < 0x20:
            result +=
                "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                + String(scalar.value, radix: 16)
        default: result.unicodeScalars.append(scalar)
        }
    }
    return result + "\""
}

extension HTTPField.Name {
    static let interopVersion = HTTPField.Name("Upload-Draft-Interop-Version")!
    static let uploadOffset = HTTPField.Name("Upload-Offset")!
    static let uploadComplete = HTTPField.Name("Upload-Complete")!
    static let uploadIncomplete = HTTPField.Name("Upload-Incomplete")!
    static let reprDigest = HTTPField.Name("Repr-Digest")!
    static let contentDigest = HTTPField.Name("Content-Digest")!
    static let wantReprDigest = HTTPField.Name("Want-Repr-Digest")!
}

/// Logs each exchange on a connection as it passes between the HTTP codec and Apple's handler.
final class RequestLog: ChannelDuplexHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    struct Exchange {
        var request: HTTPRequest
        var bytes: Int64 = 0
        var trailers: HTTPFields?
        var informational: [Int] = []
        var location: String?
        var status: Int?
        var requestEnded = false
        var responseEnded = false
    }

    private let log: LogFile
    private var current: Exchange?

    init(log: LogFile) { self.log = log }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let request):
            if let previous = current { write(previous, aborted: true) }
            current = Exchange(request: request)
        case .body(let body):
            current?.bytes += Int64(body.readableBytes)
        case .end(let trailers):
            current?.requestEnded = true
            current?.trailers = trailers
        }
        context.fireChannelRead(data)
        finishIfDone()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var ended = false
        switch unwrapOutboundIn(data) {
        case .head(let response):
            if response.status.kind == .informational {
                current?.informational.append(response.status.code)
            } else {
                current?.status = response.status.code
            }
            if let location = response.headerFields[.location] { current?.location = location }
        case .body:
            break
        case .end:
            ended = true
        }
        context.write(data, promise: promise)
        if ended {
            current?.responseEnded = true
            finishIfDone()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let exchange = current {
            current = nil
            write(exchange, aborted: true)
        }
        context.fireChannelInactive()
    }

    private func finishIfDone() {
        guard let exchange = current, exchange.requestEnded, exchange.responseEnded else { return }
        current = nil
        write(exchange, aborted: false)
    }

    private func write(_ exchange: Exchange, aborted: Bool) {
        let fields = exchange.request.headerFields
        func header(_ name: HTTPField.Name) -> JSONValue { .string(fields[name] ?? exchange.trailers?[name]) }
        log.write([
            ("method", .string(exchange.request.method.rawValue)), ("path", .string(exchange.request.path)),
            ("status", .int(exchange.status.map { Int64($0) })), ("informational", .ints(exchange.informational)),
            ("location", .string(exchange.location)), ("content_length", .int(exchange.bytes)),
            ("declared_length", .string(fields[.contentLength])), ("interop_version", header(.interopVersion)),
            ("upload_offset", header(.uploadOffset)), ("upload_complete", header(.uploadComplete)),
            ("upload_incomplete", header(.uploadIncomplete)), ("content_type", header(.contentType)),
            ("repr_digest", header(.reprDigest)), ("content_digest", header(.contentDigest)), ("aborted", .bool(aborted)),
        ])
    }
}

/// Refuses requests that name an interop version this peer was told not to take, as Apple's
/// handler does for versions it does not know: 400 with the newest version it takes.
final class VersionGate: ChannelDuplexHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let allowed: Set<Int>
    private var refusing = false

    init(allowed: Set<Int>) { self.allowed = allowed }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let request):
            if let named = request.headerFields[.interopVersion], !allowed.contains(Int(named) ?? -1) {
                refusing = true
                var response = HTTPResponse(status: .badRequest)
                response.headerFields[.interopVersion] = String(allowed.max() ?? 0)
                response.headerFields[.contentLength] = "0"
                context.write(wrapOutboundOut(.head(response)), promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                // Apple's handler asks for more input only after requests it saw end: ask here.
                context.read()
                return
            }
            refusing = false
        case .body:
            if refusing {
                context.read()
                return
            }
        case .end:
            if refusing {
                refusing = false
                context.read()
                return
            }
        }
        context.fireChannelRead(data)
    }
}

/// Numbers for partial files, unique in this process.
let partialCounter = NIOLockedValueBox(0)

/// The application behind Apple's handler: sees each upload as one request whose body may arrive
/// over several connections, and writes it to a file.
final class UploadSink: ChannelInboundHandler {
    typealias InboundIn = HTTPRequestPart
    typealias OutboundOut = HTTPResponsePart

    private let options: Options
    private var request: HTTPRequest?
    private var descriptor: Int32 = -1
    private var partialPath = ""
    private var name = "upload"
    private var received: Int64 = 0
    private var digest: OpaquePointer?

    init(options: Options) { self.options = options }

    deinit { discard() }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            request = head
            switch head.method {
            case .options:
                var response = HTTPResponse(status: .noContent)
                response.headerFields[.allow] = "OPTIONS, POST, PUT, PATCH, HEAD, DELETE"
                if options.wantDigest { response.headerFields[.wantReprDigest] = "sha-256=10" }
                respond(context, response)
            case .post, .put, .patch:
                let number = partialCounter.withLockedValue { count -> Int in
                    count += 1
                    return count
                }
                let last = (head.path ?? "").split(separator: "?").first?.split(separator: "/").last.map(String.init) ?? ""
                name = last.isEmpty || last.hasPrefix(".") ? "upload-\(number)" : last
                partialPath = "\(options.directory)/partial/\(getpid())-\(number)"
                descriptor = open(partialPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                digest = peer_sha256_new()
                if descriptor < 0 { respond(context, HTTPResponse(status: .internalServerError)) }
            default:
                respond(context, HTTPResponse(status: .methodNotAllowed))
            }
        case .body(var buffer):
            guard descriptor >= 0 else { return }
            let count = Int64(buffer.readableBytes)
            if options.corruptAt >= received, options.corruptAt < received + count {
                let index = buffer.readerIndex + Int(options.corruptAt - received)
                buffer.setInteger(buffer.getInteger(at: index, as: UInt8.self)! ^ 0xFF, at: index)
            }
            buffer.withUnsafeReadableBytes { bytes in
                var done = 0
                while done < bytes.count {
                    let written = Glibc.write(descriptor, bytes.baseAddress! + done, bytes.count - done)
                    if written <= 0 { break }
                    done += written
                }
                _ = EVP_DigestUpdate(digest, bytes.baseAddress, bytes.count)
            }
            received += count
        case .end(let trailers):
            guard descriptor >= 0 else { return }
            close(descriptor)
            descriptor = -1
            let sent = request?.headerFields[.reprDigest] ?? trailers?[.reprDigest]
            if options.wantDigest, let sent, !Self.matches(sent, finish()) {
                unlink(partialPath)
                respond(context, HTTPResponse(status: .badRequest), body: "{\"error\":\"Repr-Digest does not match\"}")
                return
            }
            var target = "\(options.directory)/uploads/\(name)"
            var suffix = 1
            while access(target, F_OK) == 0 {
                suffix += 1
                target = "\(options.directory)/uploads/\(name).\(suffix)"
            }
            rename(partialPath, target)
            partialPath = ""
            respond(context, HTTPResponse(status: .created), body: "{\"stored\":\(quoted(target)),\"size\":\(received)}")
        }
    }

    /// The upload was cancelled (DELETE) or never resumed: its partial file goes.
    func errorCaught(context: ChannelHandlerContext, error: Error) {
        discard()
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        discard()
        context.fireChannelInactive()
    }

    private func discard() {
        if descriptor >= 0 {
            close(descriptor)
            descriptor = -1
        }
        if !partialPath.isEmpty {
            unlink(partialPath)
            partialPath = ""
        }
        if let digest {
            EVP_MD_CTX_free(digest)
            self.digest = nil
        }
    }

    private func finish() -> [UInt8] {
        var value = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        _ = EVP_DigestFinal_ex(digest, &value, &length)
        return value
    }

    /// `sha-256=:BASE64:` (among other members) against the digest of what arrived.
    static func matches(_ field: String, _ digest: [UInt8]) -> Bool {
        for member in field.split(separator: ",") {
            let parts = member.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, parts[0].trimmingSpaces == "sha-256" else { continue }
            return parts[1].trimmingSpaces == ":" + base64(digest) + ":"
        }
        return false
    }

    private func respond(_ context: ChannelHandlerContext, _ head: HTTPResponse, body: String? = nil) {
        var response = head
        response.headerFields[.contentLength] = String(body?.utf8.count ?? 0)
        context.write(wrapOutboundOut(.head(response)), promise: nil)
        if let body { context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(string: body))), promise: nil) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var text = self
        while text.first == " " { text = text.dropFirst() }
        while text.last == " " { text = text.dropLast() }
        return text
    }
}

func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    var text = ""
    var index = 0
    while index < bytes.count {
        let chunk = bytes[index..<min(index + 3, bytes.count)]
        let value = chunk.enumerated().reduce(UInt32(0)) { $0 | UInt32($1.element) << (16 - 8 * UInt32($1.offset)) }
        for position in 0..<4 {
            text.append(position <= chunk.count ? alphabet[Int(value >> (18 - 6 * UInt32(position)) & 63)] : "=")
        }
        index += 3
    }
    return text
}

let options = Options.parse(CommandLine.arguments)
for folder in ["", "/partial", "/uploads"] { mkdir(options.directory + folder, 0o755) }
let log = LogFile(path: options.log)
let uploads = HTTPResumableUploadContext(
    origin: options.origin ?? "http://127.0.0.1:\(options.port)", timeout: .seconds(options.timeout))
// One event loop: every upload, whatever connection it resumes on, is handled on it.
let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let gated = options.versions != [3, 5, 6]
let bootstrap = ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture {
            let pipeline = channel.pipeline.syncOperations
            try pipeline.configureHTTPServerPipeline()
            try pipeline.addHandler(HTTP1ToHTTPServerCodec(secure: false))
            try pipeline.addHandler(RequestLog(log: log))
            if gated { try pipeline.addHandler(VersionGate(allowed: options.versions)) }
            try pipeline.addHandler(
                HTTPResumableUploadHandler(context: uploads) { upload in
                    try? upload.pipeline.syncOperations.addHandler(UploadSink(options: options))
                })
        }
    }
do {
    let server = try bootstrap.bind(host: "127.0.0.1", port: options.port).wait()
    print("IETFPeer listening on 127.0.0.1:\(options.port)")
    fflush(nil)
    try server.closeFuture.wait()
} catch {
    fputs("IETFPeer: \(error)\n", stderr)
    exit(1)
}
