internal import CCurl

/// What a body reader returns to curl.
public enum ReadResult {
    case bytes(Int)
    case abort
    case pause
}

/// One libcurl easy handle (`curl_easy_init`) and everything whose lifetime curl needs:
/// header list, MIME body, error buffer, callbacks. Used from one thread; not Sendable.
public final class EasyHandle {
    let raw: UnsafeMutableRawPointer
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private var mime: OpaquePointer?
    private let errorBuffer: UnsafeMutablePointer<CChar>

    /// Fills the buffer with the next body bytes (raw body or the MIME file part).
    public var readBody: ((UnsafeMutableRawBufferPointer) -> ReadResult)?
    /// Each response header line, as received, CRLF included (status lines too).
    /// (The bytes are libcurl's, valid during the call only.)
    var onHeaderLine: ((UnsafeRawBufferPointer) -> Void)?
    /// Response body bytes; return false to abort the transfer.
    public var onData: ((UnsafeRawBufferPointer) -> Bool)?
    /// Moves the body back to `offset` from its start (curl rewinds to resend); false if impossible.
    public var seekBody: ((Int64) -> Bool)?
    /// Trailer lines (`Name: value`) sent after a chunked upload's body.
    public var trailers: (() -> [String])?
    /// Progress `(uploadedNow, downloadedNow)`; return false to abort the transfer.
    public var onProgress: ((Int64, Int64) -> Bool)?
    /// Asked with the peer's IP address once connected, before the request goes; false refuses
    /// the connection (the transfer ends with `abortedByCallback`).
    public var allowPeer: ((String) -> Bool)?
    /// `TCP_NOTSENT_LOWAT` for the sockets this handle opens (bytes; nil: the kernel's default),
    /// with `TCP_THIN_LINEAR_TIMEOUTS`: a paced connection's settings.
    public var notSentLowWatermark: Int32?
    /// `SO_MAX_PACING_RATE` for the sockets this handle opens (bytes/s; nil: none), so that a
    /// paced connection is paced from its first byte (`setPacingRate` changes it after).
    public var initialPacingRate: Int64?
    /// The last socket curl opened for this handle (told by `CURLOPT_SOCKOPTFUNCTION`).
    private var openedSocket: Int32 = -1
    /// The value of a MIME field sent after the file part, asked for once that part is read.
    public var trailingFieldValue: (() -> [UInt8])?
    private var trailingField: [UInt8]?
    private var trailingFieldOffset = 0
    /// Whether the last request ran to its end with `CURLE_OK` (set by the multi handle).
    var completedCleanly = false

    public init() throws(CurlCode) {
        CurlGlobal.initialize()
        guard let handle = curl_easy_init() else { throw CurlCode.outOfMemory }
        raw = handle
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        try installCallbacks()
    }

    deinit {
        curl_easy_cleanup(raw)
        if let mime { curl_mime_free(mime) }
        curl_slist_free_all(headerList)
        errorBuffer.deallocate()
    }

    var errorBufferText: String? {
        let text = String(cString: errorBuffer)
        return text.isEmpty ? nil : text
    }

    /// Forgets every option of the previous request (`curl_easy_reset`), keeping the callbacks
    /// and the connection cache; the next request starts from defaults.
    public func reset() throws(CurlCode) {
        curl_easy_reset(raw)
        if let mime {
            curl_mime_free(mime)
            self.mime = nil
        }
        try installCallbacks()
    }

    /// Whether the handle can serve another transfer after `recycle`: its last request completed
    /// with `CURLE_OK` and sent neither trailers nor a MIME body. libcurl 7.88 crashed reusing a
    /// reset handle that had sent trailers, and a request that failed or was stopped half-way can
    /// leave state a reset does not clear (a failed rewind); such a handle is not worth the risk.
    public var isReusable: Bool { completedCleanly && mime == nil && trailers == nil }

    /// Makes a handle whose transfer ended as good as a new one, for the next transfer: every option
    /// and header forgotten, every handler dropped. Cheaper than a new handle: `curl_easy_init`
    /// and `curl_easy_cleanup` cost 18,000 instructions a transfer, a reset a fraction of that.
    public func recycle() throws(CurlCode) {
        completedCleanly = false
        try reset()
        curl_slist_free_all(headerList)
        headerList = nil
        readBody = nil
        onHeaderLine = nil
        onData = nil
        seekBody = nil
        trailers = nil
        onProgress = nil
        allowPeer = nil
        notSentLowWatermark = nil
        initialPacingRate = nil
        openedSocket = -1
        trailingFieldValue = nil
        trailingField = nil
        trailingFieldOffset = 0
        clearError()
    }

    /// Connects the trampolines; the userdata is this object, unretained (the owner keeps it alive).
    private func installCallbacks() throws(CurlCode) {
        let me = Unmanaged.passUnretained(self).toOpaque()
        try check(bh_curl_easy_setopt_ptr(raw, CURLOPT_ERRORBUFFER, errorBuffer), self)
        try check(
            bh_curl_easy_set_data_callback(
                raw, CURLOPT_READFUNCTION, CURLOPT_READDATA,
                { buffer, size, count, userdata in
                    EasyHandle.owner(userdata).read(into: buffer, size * count)
                }, me), self)
        try check(
            bh_curl_easy_set_data_callback(
                raw, CURLOPT_HEADERFUNCTION, CURLOPT_HEADERDATA,
                { buffer, size, count, userdata in
                    let length = size * count
                    if let buffer, let handler = EasyHandle.owner(userdata).onHeaderLine {
                        handler(UnsafeRawBufferPointer(start: buffer, count: length))
                    }
                    return length
                }, me), self)
        try check(
            bh_curl_easy_set_data_callback(
                raw, CURLOPT_WRITEFUNCTION, CURLOPT_WRITEDATA,
                { buffer, size, count, userdata in
                    let length = size * count
                    guard let handler = EasyHandle.owner(userdata).onData else { return length }
                    return handler(UnsafeRawBufferPointer(start: buffer, count: length)) ? length : 0
                }, me), self)
        try check(
            bh_curl_easy_set_seek_callback(
                raw,
                EasyHandle.seekCallback, me), self)
        try check(
            bh_curl_easy_set_trailer_callback(
                raw,
                { list, userdata in
                    guard let list, let lines = EasyHandle.owner(userdata).trailers?() else { return bh_curl_trailerfunc_ok() }
                    for line in lines { list.pointee = curl_slist_append(list.pointee, line) }
                    return bh_curl_trailerfunc_ok()
                }, me), self)
        try check(
            bh_curl_easy_set_prereq_callback(
                raw,
                { userdata, primary, _, _, _ in
                    guard let primary, let allow = EasyHandle.owner(userdata).allowPeer else { return 0 }
                    return allow(String(cString: primary)) ? 0 : 1
                }, me), self)
        try check(
            bh_curl_easy_set_sockopt_callback(
                raw,
                { userdata, socket, purpose in
                    let owner = EasyHandle.owner(userdata)
                    if purpose == CURLSOCKTYPE_IPCXN { owner.openedSocket = socket }
                    if let rate = owner.initialPacingRate { owner.setPacingRate(rate) }
                    if let bytes = owner.notSentLowWatermark {
                        // Best effort: a kernel without the options still transfers. A paced
                        // connection is a thin stream while it yields: its lost segments are
                        // resent without exponential backoff, so it is back once the queue drains.
                        _ = bh_tcp_set_notsent_lowat(socket, bytes)
                        _ = bh_tcp_set_thin_linear_timeouts(socket)
                    }
                    return bh_curl_sockopt_ok()
                }, me), self)
        try check(
            bh_curl_easy_set_xferinfo_callback(
                raw,
                { userdata, _, downloaded, _, uploaded in
                    guard let handler = EasyHandle.owner(userdata).onProgress else { return 0 }
                    return handler(Int64(uploaded), Int64(downloaded)) ? 0 : 1
                }, me), self)
    }

    fileprivate static func owner(_ userdata: UnsafeMutableRawPointer?) -> EasyHandle {
        Unmanaged<EasyHandle>.fromOpaque(userdata!).takeUnretainedValue()
    }

    /// curl rewinds a body (a redirect, an auth retry, a multipart part) through this: the plain
    /// request's seek callback and the multipart part's are the same.
    fileprivate static let seekCallback: bh_curl_seek_callback = { userdata, offset, origin in
        let owner = EasyHandle.owner(userdata)
        guard origin == SEEK_SET, let seek = owner.seekBody, seek(Int64(offset)) else {
            return bh_curl_seekfunc_cantseek()
        }
        return bh_curl_seekfunc_ok()
    }

    fileprivate func read(into buffer: UnsafeMutablePointer<CChar>?, _ capacity: Int) -> Int {
        guard let buffer, let readBody else { return 0 }
        switch readBody(UnsafeMutableRawBufferPointer(start: buffer, count: capacity)) {
        case .bytes(let count): return count
        case .abort: return bh_curl_readfunc_abort()
        case .pause: return bh_curl_readfunc_pause()
        }
    }

    // MARK: Options

    /// `curl_easy_setopt` with a `long`. Inside this module only: callers describe requests with
    /// `RequestOptions`.
    func set(_ option: CURLoption, _ value: Int) throws(CurlCode) {
        try check(bh_curl_easy_setopt_long(raw, option, value), self)
    }
    /// `curl_easy_setopt` with a `curl_off_t`.
    func set(_ option: CURLoption, offset value: Int64) throws(CurlCode) {
        try check(bh_curl_easy_setopt_off_t(raw, option, Int(value)), self)
    }
    /// `curl_easy_setopt` with a string (curl copies it).
    func set(_ option: CURLoption, _ value: String) throws(CurlCode) {
        try check(bh_curl_easy_setopt_string(raw, option, value), self)
    }

    /// Replaces the request headers (`CURLOPT_HTTPHEADER` with a `curl_slist`).
    public func setHeaders(_ lines: [String]) throws(CurlCode) {
        var list: UnsafeMutablePointer<curl_slist>?
        for line in lines { list = curl_slist_append(list, line) }
        try check(bh_curl_easy_setopt_slist(raw, CURLOPT_HTTPHEADER, list), self)
        curl_slist_free_all(headerList)
        headerList = list
    }

    /// A `multipart/form-data` body (`curl_mime_*`): text fields, then one part streamed through `readBody`.
    /// With `trailingField` (a name and the value's exact length), one more text field follows
    /// the file, its value taken from `trailingFieldValue` when curl reaches it.
    public func setMultipartBody(
        fields: [(String, String)], fileField: String, filename: String,
        contentType: String?, fileSize: Int64,
        trailingField: (name: String, length: Int)? = nil
    ) throws(CurlCode) {
        guard let form = curl_mime_init(raw) else { throw CurlCode.outOfMemory }
        if let mime { curl_mime_free(mime) }
        mime = form
        for (name, value) in fields {
            let part = curl_mime_addpart(form)
            try check(curl_mime_name(part, name), self)
            try check(curl_mime_data(part, value, value.utf8.count), self)
        }
        let part = curl_mime_addpart(form)
        try check(curl_mime_name(part, fileField), self)
        try check(curl_mime_filename(part, filename), self)
        try check(curl_mime_type(part, contentType ?? "application/octet-stream"), self)
        let me = Unmanaged.passUnretained(self).toOpaque()
        try check(
            bh_curl_mime_data_cb(
                part, Int(fileSize),
                { buffer, size, count, userdata in
                    EasyHandle.owner(userdata).read(into: buffer, size * count)
                },
                EasyHandle.seekCallback, me), self)
        if let trailingField {
            let last = curl_mime_addpart(form)
            try check(curl_mime_name(last, trailingField.name), self)
            trailingFieldOffset = 0
            self.trailingField = nil
            try check(
                bh_curl_mime_data_cb(
                    last, trailingField.length,
                    { buffer, size, count, userdata in
                        EasyHandle.owner(userdata).readTrailingField(into: buffer, size * count)
                    },
                    { userdata, offset, origin in
                        let owner = EasyHandle.owner(userdata)
                        guard origin == SEEK_SET, offset == 0 else { return bh_curl_seekfunc_cantseek() }
                        owner.trailingFieldOffset = 0
                        return bh_curl_seekfunc_ok()
                    }, me), self)
        }
        try check(bh_curl_easy_setopt_mime(raw, form), self)
    }

    private func readTrailingField(into buffer: UnsafeMutablePointer<CChar>?, _ capacity: Int) -> Int {
        guard let buffer else { return 0 }
        if trailingField == nil { trailingField = trailingFieldValue?() ?? [] }
        let value = trailingField!
        let count = min(capacity, value.count - trailingFieldOffset)
        guard count > 0 else { return 0 }
        value.withUnsafeBytes { bytes in
            UnsafeMutableRawPointer(buffer).copyMemory(from: bytes.baseAddress! + trailingFieldOffset, byteCount: count)
        }
        trailingFieldOffset += count
        return count
    }

    // MARK: Information

    /// The last response's status code (`CURLINFO_RESPONSE_CODE`).
    public var responseCode: Int {
        var value = 0
        _ = bh_curl_easy_getinfo_long(raw, CURLINFO_RESPONSE_CODE, &value)
        return value
    }

    /// Bytes uploaded by the last transfer (`CURLINFO_SIZE_UPLOAD_T`).
    public var bytesUploaded: Int64 {
        var value = 0
        _ = bh_curl_easy_getinfo_off_t(raw, CURLINFO_SIZE_UPLOAD_T, &value)
        return Int64(value)
    }

    /// Bytes downloaded by the last transfer (`CURLINFO_SIZE_DOWNLOAD_T`).
    public var bytesDownloaded: Int64 {
        var value = 0
        _ = bh_curl_easy_getinfo_off_t(raw, CURLINFO_SIZE_DOWNLOAD_T, &value)
        return Int64(value)
    }

    /// `TCP_INFO` (`getsockopt`) of the transfer's connection; nil while it has none. The socket
    /// is the one this handle opened last (exact for a request with
    /// `RequestOptions.ownConnection`), else `CURLINFO_ACTIVESOCKET`, which libcurl 7.88 tells
    /// only once a transfer is done (measured: -1 in the middle of an upload).
    public var tcpInfo: TCPInfo? {
        var socket = openedSocket
        if socket < 0, bh_curl_easy_getinfo_socket(raw, &socket) != CURLE_OK { return nil }
        guard socket >= 0 else { return nil }
        var info = bh_tcp_info()
        guard bh_tcp_info_read(socket, &info) == 0 else { return nil }
        return TCPInfo(
            rtt: Double(info.rtt) / 1e6, minRTT: Double(info.min_rtt) / 1e6, receiveRTT: Double(info.rcv_rtt) / 1e6,
            notSentBytes: Int64(info.notsent_bytes), totalRetransmits: Int64(info.total_retrans),
            deliveryRate: Int64(info.delivery_rate))
    }

    /// Has the kernel pace what the connection this handle opened last sends
    /// (`SO_MAX_PACING_RATE`, bytes/s; nil lifts it): TCP spaces its segments itself, at once
    /// and without bursts. False while there is no such socket, or the kernel refuses.
    @discardableResult
    public func setPacingRate(_ bytesPerSecond: Int64?) -> Bool {
        guard openedSocket >= 0 else { return false }
        let rate = bytesPerSecond.map { UInt32(clamping: max(1, $0)) } ?? UInt32.max
        return bh_socket_set_max_pacing_rate(openedSocket, rate) == 0
    }

    /// Clears the error buffer before a new transfer.
    public func clearError() { errorBuffer[0] = 0 }

    /// The error for a finished transfer's code, with the handle's error buffer.
    func error(for code: CURLcode) -> CurlCode { CurlCode(code, message: errorBufferText) }
}

/// What Linux's `TCP_INFO` says of a connection (times in seconds).
public struct TCPInfo: Sendable, Equatable {
    /// `tcpi_rtt`, the smoothed round-trip time of what this side sent.
    public var rtt: Double
    /// `tcpi_min_rtt`.
    public var minRTT: Double
    /// `tcpi_rcv_rtt`, the receiver's estimate (a download's side).
    public var receiveRTT: Double
    /// `tcpi_notsent_bytes`.
    public var notSentBytes: Int64
    /// `tcpi_total_retrans`.
    public var totalRetransmits: Int64
    /// `tcpi_delivery_rate`, bytes/s.
    public var deliveryRate: Int64
}
