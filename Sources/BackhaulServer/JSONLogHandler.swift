import BackhaulCore
import Glibc
import JSONCodec
import Logging

/// Writes one JSON object a line to stderr: `ts`, `level`, `msg`, `logger`, then the metadata
/// under its own dotted keys. Callers never put secrets in messages or metadata.
public struct JSONLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level
    private let label: String

    public init(label: String, level: Logger.Level) {
        self.label = label
        self.logLevel = level
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var object: JSONObject = [
            "ts": .string(RFC3339.format(SystemClock().now())), "level": .string(event.level.rawValue),
            "msg": .string(event.message.description), "logger": .string(label),
        ]
        for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) {
            object[key] = .string(value.description)
        }
        writeStandardError(JSON.object(object).serialized() + "\n")
    }
}

/// One write(2) per line, so concurrent lines do not interleave.
func writeStandardError(_ text: String) {
    var copy = text
    copy.withUTF8 { buffer in
        var offset = 0
        while offset < buffer.count {
            let written = write(2, buffer.baseAddress! + offset, buffer.count - offset)
            if written <= 0 { if errno == EINTR { continue } else { return } }
            offset += written
        }
    }
}
