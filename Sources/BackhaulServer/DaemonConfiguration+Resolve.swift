import BackhaulCore
import BackhaulFiles
import JSONCodec

/// Resolving a configuration from the table: defaults, then the config file, then the
/// environment, then the flags, each replacing what the one before set.
extension DaemonConfiguration {
    /// Resolves the configuration from arguments (without the program name), environment and file.
    public static func resolve(arguments: [String], environment: [String: String], workingDirectory: String) throws(Invalid)
        -> (DaemonConfiguration, Action)
    {
        var configuration = DaemonConfiguration(workingDirectory: workingDirectory)
        let flags: [FlagValue]
        switch try readFlags(arguments) {
        case .action(let action): return (configuration, action)
        case .flags(let given): flags = given
        }

        // The config file first: the last --config, else BACKHAUL_CONFIG.
        let config = Settings.configFile
        let configFlag = flags.last { $0.setting.name == config.name }
        if let path = configFlag?.value ?? environment[config.environment!.name] {
            let source: SettingSource = configFlag == nil ? .environment : .flag
            try apply(config, text: path, from: source, to: &configuration)
            try configuration.applyFile(path)
        }

        for setting in Settings.all where setting.name != config.name {
            guard let variable = setting.environment, let text = environment[variable.name] else { continue }
            try apply(setting, text: text, from: .environment, to: &configuration)
        }

        // Flags in the order given; a repeatable flag's values go together, as one list.
        var repeated: [String: [String]] = [:]
        for flag in flags where flag.setting.name != config.name {
            if flag.setting.flag?.repeatable == true {
                repeated[flag.setting.name, default: []].append(flag.value)
            } else {
                try apply(flag.setting, text: flag.value, from: .flag, to: &configuration)
            }
        }
        for setting in Settings.all {
            guard let values = repeated[setting.name] else { continue }
            do { try setting.apply(texts: values, to: &configuration) } catch {
                throw Invalid(description: "\(setting.flag!.name): \(error.message)")
            }
        }
        return (configuration, .run)
    }

    /// One flag as given: its setting and its text (`true` for a switch).
    struct FlagValue {
        var setting: any AnySetting
        var value: String
    }

    enum CommandLine {
        case action(Action)
        case flags([FlagValue])
    }

    /// The flags of the table, as `--name value`, `--name=value` or a bare switch; `--help`,
    /// `-h` and `--version` end the reading.
    static func readFlags(_ arguments: [String]) throws(Invalid) -> CommandLine {
        var flags: [FlagValue] = []
        var index = 0
        while index < arguments.count {
            var name = arguments[index]
            index += 1
            if name == "--help" || name == "-h" { return .action(.help) }
            if name == "--version" { return .action(.version) }
            var value: String?
            if name.hasPrefix("--"), let equals = name.firstIndex(of: "=") {
                value = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            guard let setting = Settings.all.first(where: { $0.flag?.name == name }), let flag = setting.flag else {
                throw Invalid(description: "unknown option \(name)\n\(usage)")
            }
            if let given = value, flag.negates {
                // `--no-ui=true` turns it off, as `--no-ui` does; `--no-ui=false` leaves it on.
                value = ["true", "1"].contains(given) ? "false" : ["false", "0"].contains(given) ? "true" : given
            }
            if value == nil {
                if flag.placeholder == nil {
                    value = flag.negates ? "false" : "true"
                } else {
                    guard index < arguments.count else {
                        throw Invalid(description: "\(name) needs a value (\(flag.placeholder!))")
                    }
                    value = arguments[index]
                    index += 1
                }
            }
            flags.append(FlagValue(setting: setting, value: value!))
        }
        return .flags(flags)
    }

    /// Applies one text to a setting; a refusal names where the text came from (a secret's
    /// text is not repeated).
    static func apply(
        _ setting: any AnySetting, text: String, from source: SettingSource, to configuration: inout DaemonConfiguration
    )
        throws(Invalid)
    {
        do {
            try setting.apply(text: text, from: source, to: &configuration)
        } catch {
            let shown = setting.isSecret ? "" : (source == .flag ? " \(text)" : "=\(text)")
            let origin = source == .flag ? setting.flag!.name : setting.environment!.name
            throw Invalid(description: "\(origin)\(shown): \(error.message)")
        }
    }

    /// The config file: a JSON object of the settings' file keys. A dotted key
    /// (`network.route_file`) is read from inside its object; an unknown key is refused.
    mutating func applyFile(_ path: String) throws(Invalid) {
        func refused(_ message: String) -> Invalid { Invalid(description: "config file \(path): \(message)") }
        /// `key: message`, unless the message names the member itself (`network.check_interval: …`).
        func refused(_ key: String, _ error: SettingError) -> Invalid {
            let message = error.message
            return refused(message.hasPrefix(key + ".") || message.hasPrefix(key + ":") ? message : "\(key): \(message)")
        }
        guard let bytes = SmallFile.read(path) else { throw Invalid(description: "cannot read the config file \(path)") }
        let value: JSON
        do { value = try JSON.parse(bytes) } catch { throw refused("not valid JSON: \(error)") }
        guard let object = value.objectValue else { throw refused("must hold a JSON object") }
        for (key, member) in object {
            let direct = Settings.all.first { $0.file?.keys.contains(key) == true }
            // Settings read from inside this member (`network` holds `route_file`).
            let nested = Settings.all.compactMap { setting in
                setting.file?.keys.first { $0.hasPrefix(key + ".") }.map { (setting, String($0.dropFirst(key.count + 1))) }
            }
            guard direct != nil || !nested.isEmpty else { throw refused("unknown setting \(key)") }
            if let direct {
                do { try direct.apply(json: member, to: &self) } catch { throw refused(key, error) }
            }
            for (setting, inner) in nested {
                guard let innerMember = member[inner], !innerMember.isNull else { continue }
                do { try setting.apply(json: innerMember, to: &self) } catch { throw refused("\(key).\(inner)", error) }
            }
        }
    }
}
