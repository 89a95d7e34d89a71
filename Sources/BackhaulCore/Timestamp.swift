import Glibc
import JSONValue

/// Seconds since the Unix epoch, as a Double, formatted as RFC 3339 UTC with milliseconds.
public typealias Timestamp = Double

public enum RFC3339 {
    /// `2026-11-22T02:00:00.000Z`
    public static func format(_ time: Timestamp) -> String {
        String(unsafeUninitializedCapacity: 24) { buffer in write(time, into: buffer.baseAddress!) }
    }

    /// Writes `format(time)`'s 24 bytes at `output`, digit by digit (this runs several times for
    /// every task shown); returns 24.
    @discardableResult
    public static func write(_ time: Timestamp, into output: UnsafeMutablePointer<UInt8>) -> Int {
        // A time no four-digit year holds (a stored value gone wrong) is written as the nearest
        // one that does; NaN as the epoch.
        let time = time.isNaN ? 0 : min(max(time, earliest), latest)
        var seconds = time_t(time.rounded(.down))
        var milliseconds = Int(((time - Double(seconds)) * 1000).rounded())
        if milliseconds >= 1000 {
            seconds += 1
            milliseconds -= 1000
        }
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func put(_ value: Int, _ width: Int, at offset: Int) {
            var rest = value
            for position in stride(from: offset + width - 1, through: offset, by: -1) {
                output[position] = UInt8(48 + rest % 10)
                rest /= 10
            }
        }
        put(Int(parts.tm_year) + 1900, 4, at: 0)
        output[4] = 45
        put(Int(parts.tm_mon) + 1, 2, at: 5)
        output[7] = 45
        put(Int(parts.tm_mday), 2, at: 8)
        output[10] = 84
        put(Int(parts.tm_hour), 2, at: 11)
        output[13] = 58
        put(Int(parts.tm_min), 2, at: 14)
        output[16] = 58
        put(Int(parts.tm_sec), 2, at: 17)
        output[19] = 46
        put(milliseconds, 3, at: 20)
        output[23] = 90
        return 24
    }

    /// 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z: what `format` can write.
    static let earliest: Timestamp = -62_167_219_200
    static let latest: Timestamp = 253_402_300_799.999

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; nil when it is not that.
    public static func parse(_ text: String) -> Timestamp? {
        let bytes = Array(text.utf8)
        guard bytes.count >= 20 else { return nil }
        func number(_ range: Range<Int>) -> Int32? {
            var value: Int32 = 0
            for index in range {
                guard index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 else { return nil }
                value = value * 10 + Int32(bytes[index] - 48)
            }
            return value
        }
        guard let year = number(0..<4), bytes[4] == 45, let month = number(5..<7), bytes[7] == 45,
            let day = number(8..<10), bytes[10] == 84 || bytes[10] == 116, let hour = number(11..<13),
            bytes[13] == 58, let minute = number(14..<16), bytes[16] == 58, let second = number(17..<19),
            (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        var index = 19
        var fraction = 0.0
        if bytes[index] == 46 {
            index += 1
            var scale = 0.1
            let start = index
            while index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 {
                fraction += Double(bytes[index] - 48) * scale
                scale /= 10
                index += 1
            }
            guard index > start else { return nil }
        }
        guard index < bytes.count else { return nil }
        var offset = 0
        if bytes[index] == 90 || bytes[index] == 122 {
            index += 1
        } else if bytes[index] == 43 || bytes[index] == 45 {
            guard let hours = number(index + 1..<index + 3), index + 3 < bytes.count, bytes[index + 3] == 58,
                let minutes = number(index + 4..<index + 6), hours < 24, minutes < 60
            else { return nil }
            offset = Int(hours * 3600 + minutes * 60) * (bytes[index] == 43 ? 1 : -1)
            index += 6
        } else {
            return nil
        }
        guard index == bytes.count else { return nil }
        var parts = tm()
        parts.tm_year = year - 1900
        parts.tm_mon = month - 1
        parts.tm_mday = day
        parts.tm_hour = hour
        parts.tm_min = minute
        parts.tm_sec = second
        let seconds = timegm(&parts)
        return Double(seconds - offset) + fraction
    }
}

/// A source of the current time; the engine passes it to the pure parts.
public protocol Clock: Sendable {
    func now() -> Timestamp
}

public struct SystemClock: Clock {
    public init() {}
    public func now() -> Timestamp {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}

/// Monotonic seconds, for rates and timeouts measured inside one process.
public func monotonicSeconds() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
}

/// The daemon's local time of day (policy windows and daily budgets follow it; `TZ` sets it,
/// containers are usually UTC).
public enum LocalTime {
    /// The local date (`YYYY-MM-DD`), the minute of the day and the seconds into that minute.
    public static func components(of time: Timestamp) -> (day: String, minute: Int, second: Double) {
        var seconds = time_t(time.rounded(.down))
        var parts = tm()
        localtime_r(&seconds, &parts)
        func pad(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let day = "\(parts.tm_year + 1900)-\(pad(parts.tm_mon + 1))-\(pad(parts.tm_mday))"
        return (day, Int(parts.tm_hour) * 60 + Int(parts.tm_min), Double(parts.tm_sec) + time - time.rounded(.down))
    }
}

extension JSONWriter {
    /// A time as an RFC 3339 string (`RFC3339.format`), written in place; null when nil.
    public mutating func timestamp(_ time: Timestamp?) {
        guard let time else { return null() }
        ascii(reserving: 26) { output in
            output[0] = UInt8(ascii: "\"")
            RFC3339.write(time, into: output + 1)
            output[25] = UInt8(ascii: "\"")
            return 26
        }
    }
}
