import BackhaulCore
import JSONCodec

/// One setting of the daemon, declared once in `DaemonConfiguration.settings`: its name (the
/// config-file key), flag, environment variable, default, how its values are read and checked,
/// its help text, and what `/v1/info` shows of it. Flag parsing, the environment, the config
/// file, the usage text, `/v1/info` and the README table are all derived from these.
struct Setting<Value: Sendable>: Sendable {
    let name: String
    let flag: FlagSpelling?
    let environment: EnvironmentSpelling?
    let file: FileSpelling?
    /// The value before any source; `defaultText` says it in words when the value would not
    /// (`nil` CA bundle: "the system's").
    let defaultValue: Value
    let defaultText: String?
    let help: String
    let value: SettingValue<Value>
    /// The variable's text, when it is read otherwise than a flag's (`BACKHAUL_TOKENS` holds the
    /// entries themselves, `--token-file` names a file of them).
    let environmentText: (@Sendable (String) throws(SettingError) -> Value)?
    /// Where the resolved value lives.
    let property: any WritableKeyPath<DaemonConfiguration, Value> & Sendable
    let info: InfoExposure<Value>

    init(
        _ name: String, flag: FlagSpelling?, environment: EnvironmentSpelling?, file: FileSpelling?, default defaultValue: Value,
        defaultText: String? = nil, help: String, value: SettingValue<Value>,
        environmentText: (@Sendable (String) throws(SettingError) -> Value)? = nil,
        property: any WritableKeyPath<DaemonConfiguration, Value> & Sendable, info: InfoExposure<Value> = .shown
    ) {
        self.name = name
        self.flag = flag
        self.environment = environment
        self.file = file
        self.defaultValue = defaultValue
        self.defaultText = defaultText
        self.help = help
        self.value = value
        self.environmentText = environmentText
        self.property = property
        self.info = info
    }
}

/// Any setting, whatever its value's type: what the resolver, the usage text, `/v1/info` and
/// the README table need.
protocol AnySetting: Sendable {
    var name: String { get }
    var flag: FlagSpelling? { get }
    var environment: EnvironmentSpelling? { get }
    var file: FileSpelling? { get }
    var help: String { get }
    /// Whether the value is a secret: never shown, never echoed in an error.
    var isSecret: Bool { get }
    /// The default in words, or as its value shows (`16`, `127.0.0.1:8427`).
    var defaultDescription: (text: String, isLiteral: Bool) { get }
    func apply(text: String, from source: SettingSource, to configuration: inout DaemonConfiguration) throws(SettingError)
    func apply(texts: [String], to configuration: inout DaemonConfiguration) throws(SettingError)
    func apply(json: JSON, to configuration: inout DaemonConfiguration) throws(SettingError)
    /// The member `/v1/info` shows, if any.
    func info(_ configuration: DaemonConfiguration) -> (String, JSON)?
}

/// Where a text came from (a config-file member is JSON, applied by `apply(json:to:)`).
enum SettingSource: Sendable, Equatable {
    case environment
    case flag
}

extension Setting: AnySetting {
    var isSecret: Bool {
        if case .secret = info { return true }
        return false
    }

    var defaultDescription: (text: String, isLiteral: Bool) {
        if let defaultText { return (defaultText, false) }
        switch value.show(defaultValue) {
        case .string(let text): return (text, true)
        case .double(let number): return (number.shortText, false)
        case .int(let number): return (String(number), false)
        case .array(let items):
            return (items.map { $0.doubleValue?.shortText ?? $0.stringValue ?? "" }.joined(separator: ","), false)
        case let other: return (other.serialized(), false)
        }
    }

    func apply(text: String, from source: SettingSource, to configuration: inout DaemonConfiguration) throws(SettingError) {
        if source == .environment, let environmentText {
            configuration[keyPath: property] = try environmentText(text)
        } else {
            configuration[keyPath: property] = try value.text(text)
        }
    }

    func apply(texts: [String], to configuration: inout DaemonConfiguration) throws(SettingError) {
        if let read = value.texts {
            configuration[keyPath: property] = try read(texts)
        } else {
            for text in texts { configuration[keyPath: property] = try value.text(text) }
        }
    }

    func apply(json: JSON, to configuration: inout DaemonConfiguration) throws(SettingError) {
        configuration[keyPath: property] = try value.json(json)
    }

    func info(_ configuration: DaemonConfiguration) -> (String, JSON)? {
        let current = configuration[keyPath: property]
        switch info {
        case .hidden: return nil
        case .shown: return (name, value.show(current))
        case .summary(let key, let summary), .secret(let key, let summary): return (key, summary(current))
        }
    }
}

/// A setting's flag: `--listen HOST:PORT`; without a placeholder, a switch (`--deny-private-destinations`).
struct FlagSpelling: Sendable {
    let name: String
    let placeholder: String?
    /// Given more than once, its values together make the setting (`--allow-root A --allow-root B`).
    let repeatable: Bool
    /// A switch that turns the setting off (`--no-ui`).
    let negates: Bool

    init(_ name: String, _ placeholder: String?, repeatable: Bool = false, negates: Bool = false) {
        self.name = name
        self.placeholder = placeholder
        self.repeatable = repeatable
        self.negates = negates
    }
}

/// A setting's `BACKHAUL_*` variable; `note` says how its text is read when that is not plain.
struct EnvironmentSpelling: Sendable {
    let name: String
    let note: String?

    init(_ name: String, note: String? = nil) {
        self.name = name
        self.note = note
    }
}

/// A setting's config-file key; a dotted key is a member of an object (`network.route_file`).
/// `aliases` are other keys read the same way, not documented.
struct FileSpelling: Sendable {
    let key: String
    let note: String?
    let aliases: [String]

    init(_ key: String, note: String? = nil, aliases: [String] = []) {
        self.key = key
        self.note = note
        self.aliases = aliases
    }

    var keys: [String] { [key] + aliases }
}

/// What `/v1/info` shows of a setting.
enum InfoExposure<Value: Sendable>: Sendable {
    /// Nothing (the config file's path; the policy, which has its own endpoint).
    case hidden
    /// The value, under the setting's name.
    case shown
    /// Something else about it under another name (the network's check interval).
    case summary(String, @Sendable (Value) -> JSON)
    /// A secret: only the summary, never the value, not even in an error message.
    case secret(String, @Sendable (Value) -> JSON)
}

/// Why a value was refused, without where it came from (the resolver adds that).
struct SettingError: Error, Sendable {
    let message: String
    init(_ message: String) { self.message = message }
}
