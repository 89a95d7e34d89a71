internal import CCurl

/// One libcurl multi handle (`curl_multi_init`) and the easy handles added to it.
/// Owned by one thread (the engine's); other threads reach it only through `MultiWaker`.
public final class MultiHandle {
    private let raw: UnsafeMutableRawPointer
    private var handles: [UnsafeMutableRawPointer: EasyHandle] = [:]

    /// `keptConnections`: the size of the connection cache (`CURLMOPT_MAXCONNECTS`): past it, a
    /// connection a transfer is done with closes the oldest idle one. 0: libcurl's default, four
    /// for every transfer added at the moment.
    public init(maxTotalConnections: Int = 0, maxHostConnections: Int = 0, keptConnections: Int = 0) throws(CurlMultiCode) {
        CurlGlobal.initialize()
        guard let multi = curl_multi_init() else { throw CurlMultiCode(rawValue: CURLM_OUT_OF_MEMORY.rawValue) }
        raw = multi
        if keptConnections > 0 {
            try check(bh_curl_multi_setopt_long(raw, CURLMOPT_MAXCONNECTS, keptConnections))
        }
        if maxTotalConnections > 0 {
            try check(bh_curl_multi_setopt_long(raw, CURLMOPT_MAX_TOTAL_CONNECTIONS, maxTotalConnections))
        }
        if maxHostConnections > 0 {
            try check(bh_curl_multi_setopt_long(raw, CURLMOPT_MAX_HOST_CONNECTIONS, maxHostConnections))
        }
    }

    deinit {
        for (pointer, _) in handles { curl_multi_remove_handle(raw, pointer) }
        handles.removeAll()
        curl_multi_cleanup(raw)
    }

    /// A thread-safe way to interrupt `poll` from another thread (`curl_multi_wakeup`).
    /// Valid while this multi handle lives.
    public var waker: MultiWaker { MultiWaker(raw: raw) }

    public var count: Int { handles.count }

    /// Starts a transfer (`curl_multi_add_handle`); the multi handle keeps the easy handle alive.
    public func add(_ easy: EasyHandle) throws(CurlMultiCode) {
        easy.clearError()
        easy.completedCleanly = false
        try check(curl_multi_add_handle(raw, easy.raw))
        handles[easy.raw] = easy
    }

    /// Stops a transfer (`curl_multi_remove_handle`); nothing is reported for it afterwards.
    public func remove(_ easy: EasyHandle) {
        guard handles.removeValue(forKey: easy.raw) != nil else { return }
        curl_multi_remove_handle(raw, easy.raw)
    }

    /// Drives all transfers (`curl_multi_perform`); returns the number still running.
    @discardableResult
    public func perform() throws(CurlMultiCode) -> Int {
        var running: Int32 = 0
        try check(curl_multi_perform(raw, &running))
        return Int(running)
    }

    /// Waits for activity, a wakeup, or the timeout (`curl_multi_poll`).
    public func poll(timeoutMilliseconds: Int) throws(CurlMultiCode) {
        try check(curl_multi_poll(raw, nil, 0, Int32(clamping: timeoutMilliseconds), nil))
    }

    /// Finished transfers since the last call (`curl_multi_info_read`), removed from the multi handle.
    public func completed() -> [(EasyHandle, CurlCode)] {
        var result: [(EasyHandle, CurlCode)] = []
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(raw, &remaining) {
            guard bh_curl_msg_is_done(message) != 0, let pointer = bh_curl_msg_easy_handle(message),
                let easy = handles[pointer]
            else { continue }
            let code = easy.error(for: bh_curl_msg_result(message))
            easy.completedCleanly = code.rawValue == CurlCode.ok.rawValue
            remove(easy)
            result.append((easy, code))
        }
        return result
    }
}

/// Wakes a `MultiHandle` blocked in `poll` from any thread (`curl_multi_wakeup` is thread-safe).
/// The engine guarantees the multi handle outlives every waker it hands out.
public struct MultiWaker: @unchecked Sendable {
    fileprivate let raw: UnsafeMutableRawPointer
    public func wake() { curl_multi_wakeup(raw) }
}
