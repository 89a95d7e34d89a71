import Foundation
import Testing

/// docs/architecture.md's module table says what Package.swift says, and the graph keeps the rule
/// the page states: only a wrapper (or the test targets) depends on a C module.
@Suite("The module graph")
struct ArchitectureTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The Swift wrappers, the only modules that may import a C module (`C…`).
    static let wrappers: Set = ["Curl", "MicroHTTP", "SQLite", "PostgreSQL", "JSONCodec", "Digest", "Systemd", "Threads"]

    @Test("docs/architecture.md's module table is Package.swift's targets and their dependencies")
    func documentedGraph() throws {
        let manifest = try String(contentsOf: Self.root.appendingPathComponent("Package.swift"), encoding: .utf8)
        let doc = try String(contentsOf: Self.root.appendingPathComponent("docs/architecture.md"), encoding: .utf8)
        let graph = PackageGraph(manifest: manifest)
        #expect(graph.targets.count > 15, "the manifest should read: \(graph.targets)")
        let table = doc.split(separator: "\n").filter { $0.hasPrefix("| `") }.compactMap(Self.row)
        let documented = Dictionary(table, uniquingKeysWith: { first, _ in first })
        #expect(documented.count == table.count, "a module appears twice in the table")
        let expected = graph.targets.filter { !$0.test }
        let shouldRead = expected.map { "| `\($0.name)` | \($0.dependencies.map { "`\($0)`" }.joined(separator: ", ")) |" }
        #expect(
            Set(documented.keys) == Set(expected.map(\.name)),
            "docs/architecture.md's table should have one row per module:\n\(shouldRead.joined(separator: "\n"))")
        for target in expected {
            #expect(
                documented[target.name] == target.dependencies, "\(target.name): the table's row should read as Package.swift")
        }
    }

    @Test("only the wrappers depend on a C module")
    func cStaysInWrappers() throws {
        let manifest = try String(contentsOf: Self.root.appendingPathComponent("Package.swift"), encoding: .utf8)
        for target in PackageGraph(manifest: manifest).targets where !target.test && !Self.wrappers.contains(target.name) {
            let cModules = target.dependencies.filter { $0.hasPrefix("C") && $0.dropFirst().first?.isUppercase == true }
            #expect(cModules.isEmpty, "\(target.name) depends on \(cModules)")
        }
    }

    /// The store's interface stands alone: `BackhaulQueue` imports no database, neither driver
    /// imports the other, and only the wiring (and tests) sees a driver.
    @Test("the store's two drivers depend on its interface, not on each other")
    func driversApart() throws {
        let manifest = try String(contentsOf: Self.root.appendingPathComponent("Package.swift"), encoding: .utf8)
        let drivers: Set = ["BackhaulSQLite", "BackhaulPostgres"]
        for target in PackageGraph(manifest: manifest).targets where !target.test {
            let seen = drivers.intersection(target.dependencies)
            switch target.name {
            case "BackhaulServer": #expect(seen == drivers)
            case "BackhaulQueue":
                #expect(seen.isEmpty && !target.dependencies.contains { ["SQLite", "PostgreSQL"].contains($0) })
            case "BackhaulSQLite", "BackhaulPostgres":
                #expect(target.dependencies.contains("BackhaulQueue") && seen.isEmpty, "\(target.name) depends on \(seen)")
            default: #expect(seen.isEmpty, "\(target.name) depends on the driver(s) \(seen)")
            }
        }
    }

    /// A table row `| \`Name\` | \`A\`, \`B\` |` as the name and its dependencies in order.
    static func row(_ line: Substring) -> (String, [String])? {
        let cells = line.split(separator: "|", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        guard cells.count == 4, cells[1].hasPrefix("`") else { return nil }
        let names = { (cell: String) in
            cell.split(separator: ",").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: " `")) }.filter {
                !$0.isEmpty && $0 != "—"
            }
        }
        return (names(cells[1]).first ?? "", names(cells[2]))
    }
}

/// The targets of a Package.swift as written in this repository: `.target(name: "X",
/// dependencies: [...])` and its kinds, a product dependency read as its product's name.
struct PackageGraph {
    struct Target: Equatable {
        var name: String
        var dependencies: [String]
        var test: Bool
    }
    var targets: [Target] = []

    init(manifest: String) {
        // The `Package(...)` literal only: a target appended to it under a condition (the fuzz
        // binary, built with BACKHAUL_FUZZ set) is a tool for tests, not part of the product's graph.
        var text = Array(manifest.unicodeScalars)
        if let literal = manifest.range(of: "let package = Package(") {
            let open = manifest.unicodeScalars.distance(from: manifest.unicodeScalars.startIndex, to: literal.upperBound)
            text = Array(text[..<Self.closing(in: text, from: open, open: "(", close: ")")])
        }
        var index = 0
        let kinds = [".target(": false, ".executableTarget(": false, ".testTarget(": true]
        while index < text.count {
            guard let (kind, test) = kinds.first(where: { Self.matches($0.key, in: text, at: index) }) else {
                index += 1
                continue
            }
            let start = index + kind.unicodeScalars.count
            let end = Self.closing(in: text, from: start, open: "(", close: ")")
            let call = String(String.UnicodeScalarView(text[start..<end]))
            index = end
            guard let name = Self.strings(in: call).first else { continue }
            var dependencies: [String] = []
            if let list = call.range(of: "dependencies: [") {
                let scalars = Array(call.unicodeScalars)
                let from = call.unicodeScalars.distance(from: call.unicodeScalars.startIndex, to: list.upperBound)
                let to = Self.closing(in: scalars, from: from, open: "[", close: "]")
                let body = String(String.UnicodeScalarView(scalars[from..<to]))
                dependencies = Self.dependencies(in: body)
            }
            targets.append(Target(name: name, dependencies: dependencies, test: test))
        }
    }

    /// The names in a dependency list: `"X"` and `.product(name: "X", package: …)` alike.
    static func dependencies(in list: String) -> [String] {
        var names: [String] = []
        var rest = Substring(list)
        while let quote = rest.firstIndex(of: "\"") {
            let before = rest[..<quote]
            let after = rest[rest.index(after: quote)...]
            guard let closing = after.firstIndex(of: "\"") else { break }
            let name = String(after[..<closing])
            rest = after[after.index(after: closing)...]
            // A product's second string is its package.
            if before.hasSuffix("package: ") { continue }
            names.append(name)
        }
        return names
    }

    static func strings(in text: String) -> [String] {
        text.split(separator: "\"", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map {
            String($0.element)
        }
    }

    static func matches(_ word: String, in text: [Unicode.Scalar], at index: Int) -> Bool {
        let scalars = Array(word.unicodeScalars)
        guard index + scalars.count <= text.count else { return false }
        return Array(text[index..<index + scalars.count]) == scalars
    }

    /// The index of the bracket that closes the one opened just before `from`.
    static func closing(in text: [Unicode.Scalar], from: Int, open: Unicode.Scalar, close: Unicode.Scalar) -> Int {
        var depth = 1
        var index = from
        while index < text.count {
            if text[index] == open { depth += 1 }
            if text[index] == close {
                depth -= 1
                if depth == 0 { return index }
            }
            index += 1
        }
        return text.count
    }
}
