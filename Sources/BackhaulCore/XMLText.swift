/// Just enough XML for S3's answers: the text of simple elements.
enum XMLText {
    static func first(_ tag: String, in body: [UInt8]) -> String? { blocks(tag, in: body).first.map(unescape) }

    /// The inner text of every `<tag>…</tag>` in order.
    static func blocks(_ tag: String, in body: [UInt8]) -> [String] {
        let text = String(decoding: body, as: UTF8.self)
        var result: [String] = []
        var rest = Substring(text)
        let open = "<\(tag)>"
        let close = "</\(tag)>"
        while let start = rest.firstRange(of: open) {
            let after = rest[start.upperBound...]
            guard let end = after.firstRange(of: close) else { break }
            result.append(String(after[..<end.lowerBound]))
            rest = after[end.upperBound...]
        }
        return result
    }

    /// Character data with its references decoded in one pass: the five named entities and
    /// numeric references, decimal (`&#34;`) and hexadecimal (`&#x22;`), as some S3 servers write
    /// an ETag's quotes. A reference that is not one of those (or names no Unicode scalar) stays as
    /// it was.
    static func unescape(_ text: String) -> String {
        guard text.contains("&") else { return text }
        var result = ""
        var rest = Substring(text)
        while let ampersand = rest.firstIndex(of: "&") {
            result += rest[..<ampersand]
            let after = rest[rest.index(after: ampersand)...]
            if let semicolon = after.prefix(12).firstIndex(of: ";"), let decoded = reference(after[..<semicolon]) {
                result.unicodeScalars.append(decoded)
                rest = after[after.index(after: semicolon)...]
            } else {
                result += "&"
                rest = after
            }
        }
        return result + rest
    }

    /// What the reference between `&` and `;` stands for, or nil.
    private static func reference(_ name: Substring) -> Unicode.Scalar? {
        switch name {
        case "quot": return "\""
        case "lt": return "<"
        case "gt": return ">"
        case "apos": return "'"
        case "amp": return "&"
        default: break
        }
        guard name.first == "#" else { return nil }
        let digits = name.dropFirst()
        let value = digits.first == "x" || digits.first == "X" ? UInt32(digits.dropFirst(), radix: 16) : UInt32(digits, radix: 10)
        return value.flatMap(Unicode.Scalar.init)
    }

    static func escape(_ text: String) -> String {
        text.replacing("&", with: "&amp;").replacing("<", with: "&lt;").replacing(">", with: "&gt;").replacing(
            "\"", with: "&quot;")
    }
}
