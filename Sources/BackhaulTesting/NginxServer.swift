import Foundation
import Glibc

/// nginx on 127.0.0.1 as a WebDAV PUT sink (and static file server), in its own prefix. With a
/// certificate it also listens for https on `tlsPort`, speaking HTTP/2 to clients that offer it
/// (ALPN) unless `http2` is false, and logs each request there as `connection protocol method uri status` in
/// `tlsAccessLog`.
public final class NginxServer {
    public let root: String
    public let port: UInt16
    public let tlsPort: UInt16?
    public let tlsAccessLog: String
    /// The plain server's request log (with `timingLog`).
    public let accessLog: String
    private let prefix: String
    private let process = Process()

    public static var binary: String? {
        ["/usr/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// With `timingLog`, the plain server logs each request to `accessLog` as
    /// `end start method uri status length` (seconds since 1970, to the millisecond), to show
    /// which requests for one path overlapped.
    public init(
        directory: String, tls certificate: SelfSignedCertificate? = nil, http2: Bool = true, timingLog: Bool = false
    ) throws {
        guard let binary = Self.binary else { throw NginxError(message: "nginx is not installed: run `make test-deps`") }
        prefix = directory
        root = directory + "/root"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory + "/tmp", withIntermediateDirectories: true)
        port = try freePort()
        tlsPort = try certificate.map { _ in try freePort() }
        tlsAccessLog = directory + "/tls-access.log"
        accessLog = directory + "/access.log"
        // `$request_time` is how long nginx took from the request's first byte to the log line.
        let timing = timingLog ? "access_log \(directory)/access.log timing;" : ""
        let location = """
            location / {
                        root \(root);
                        dav_methods PUT DELETE;
                        create_full_put_path on;
                        client_max_body_size 0;
                    }
            """
        var tlsServer = ""
        if let certificate, let tlsPort {
            // `listen … http2` (nginx 1.22; from 1.25.1 it is `http2 on`, and this form warns).
            tlsServer = """
                log_format connections '$connection $server_protocol $request_method $uri $status';
                    server {
                        listen 127.0.0.1:\(tlsPort) ssl\(http2 ? " http2" : "");
                        ssl_certificate \(certificate.certificate);
                        ssl_certificate_key \(certificate.key);
                        access_log \(tlsAccessLog) connections;
                        \(location)
                    }
                """
        }
        let user = getuid() == 0 ? "user root;" : ""
        let configuration = """
            \(user)
            worker_processes 1;
            daemon off;
            error_log \(directory)/error.log;
            pid \(directory)/nginx.pid;
            events { worker_connections 512; }
            http {
                access_log off;
                log_format timing '$msec $request_time $request_method $uri $status $request_length';
                client_body_temp_path \(directory)/tmp;
                proxy_temp_path \(directory)/tmp;
                fastcgi_temp_path \(directory)/tmp;
                uwsgi_temp_path \(directory)/tmp;
                scgi_temp_path \(directory)/tmp;
                server {
                    listen 127.0.0.1:\(port);
                    \(timing)
                    \(location)
                }
                \(tlsServer)
            }
            """
        try configuration.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        // In the foreground, as our child: a daemonising parent that exits at once is not reaped
        // reliably by Foundation's Process on Linux.
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["-c", directory + "/nginx.conf", "-p", directory + "/"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let port = self.port
        let tlsPort = self.tlsPort
        let listening = eventually(timeout: 10) {
            ((try? connectable(port: port)) == true && tlsPort.map { (try? connectable(port: $0)) == true } ?? true)
                || !process.isRunning
        }
        guard listening, process.isRunning else {
            throw NginxError(
                message: "nginx did not start: \((try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? "")")
        }
    }

    deinit { stop() }

    public func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGQUIT)
        if !eventually(timeout: 5, { !process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// The https URL of `path` (nginx was given a certificate).
    public func tlsURL(_ path: String) -> String {
        guard let tlsPort else { preconditionFailure("nginx listens for https only when given a certificate") }
        return "https://127.0.0.1:\(tlsPort)\(path)"
    }

    public struct NginxError: Error, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
public func connectable(port: UInt16) throws -> Bool {
    let socketDescriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(socketDescriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = port.bigEndian
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(socketDescriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
        }
    }
}

/// A port that was free a moment ago (for servers that cannot bind port 0 and report it).
public func freePort() throws -> UInt16 {
    let socketDescriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(socketDescriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(socketDescriptor, pointer, length) == 0 && getsockname(socketDescriptor, pointer, &length) == 0
        }
    }
    guard bound else { throw NginxServer.NginxError(message: "cannot find a free port") }
    return UInt16(bigEndian: address.sin_port)
}
