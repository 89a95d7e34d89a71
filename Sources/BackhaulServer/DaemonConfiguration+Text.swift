/// The texts derived from the settings table: `backhauld --help`, and the rows of the README's
/// Configuration table (a test checks the README against them).
extension DaemonConfiguration {
    public static let usage: String = {
        let width = 36
        func padded(_ text: String) -> String { text + String(repeating: " ", count: max(1, width - text.count)) }
        var lines = [
            "usage: backhauld [options]",
            "",
            "Each setting is its default, then the JSON config file's key (--config), then its BACKHAUL_*",
            "variable, then its flag; each replaces the one before. A repeatable flag's values make one list.",
            "",
        ]
        for setting in Settings.all {
            guard let flag = setting.flag else { continue }
            let spelled = flag.name + (flag.placeholder.map { " \($0)" } ?? "")
            let (defaultText, _) = setting.defaultDescription
            lines.append("  " + padded(spelled) + setting.help + (flag.repeatable ? " (repeatable)" : ""))
            var sources: [String] = []
            if let variable = setting.environment {
                sources.append(variable.name + (variable.note.map { " (\($0.replacing("`", with: "")))" } ?? ""))
            }
            if let file = setting.file { sources.append("config file \"\(file.key)\"") }
            sources.append("default \(defaultText)")
            lines.append("  " + padded("") + sources.joined(separator: "; "))
        }
        lines.append("  --version, --help")
        lines.append("config file only:")
        for setting in Settings.all where setting.flag == nil {
            guard let file = setting.file else { continue }
            lines.append("  " + padded("\"\(file.key)\"") + setting.help)
        }
        return lines.joined(separator: "\n")
    }()

    /// The README's Configuration table: one row per setting, `—` where a setting has no such
    /// spelling.
    static var markdownTable: String {
        func code(_ text: String) -> String { "`\(text)`" }
        func noted(_ text: String, _ note: String?) -> String { code(text) + (note.map { " (\($0))" } ?? "") }
        var rows = ["| flag | environment | config file key | default |", "|---|---|---|---|"]
        for setting in Settings.all {
            let flag = setting.flag.map { flag in
                code(flag.name + (flag.placeholder.map { " \($0)" } ?? "")) + (flag.repeatable ? " (repeatable)" : "")
            }
            let variable = setting.environment.map { noted($0.name, $0.note) }
            let key = setting.file.map { noted($0.key, $0.note) }
            let (defaultText, isLiteral) = setting.defaultDescription
            let cells = [flag ?? "—", variable ?? "—", key ?? "—", isLiteral ? code(defaultText) : defaultText]
            rows.append("| " + cells.joined(separator: " | ") + " |")
        }
        return rows.joined(separator: "\n")
    }
}
