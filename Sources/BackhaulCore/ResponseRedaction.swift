/// What a server's answer may repeat of the request's credentials, taken out before the answer is
/// stored and shown as the task's `response` (docs/credentials.md). S3's `SignatureDoesNotMatch`
/// repeats the signature it was given (`SignatureProvided`) and the canonical request, whose query
/// holds `X-Amz-Credential` and `X-Amz-Security-Token`, as text and as hex bytes.
public enum ResponseRedaction {
    /// Signed query parameters that say how, not with what, a request was signed: left shown, as
    /// hiding a date or `host` everywhere in a body would hide much and protect nothing.
    static let publicParameters: Set<String> = ["x-amz-algorithm", "x-amz-date", "x-amz-expires", "x-amz-signedheaders"]
    /// Query parameters whose values are credentials whoever signed the request.
    static let credentialParameters = ["x-amz-signature", "x-amz-security-token", "x-amz-credential"]
    /// S3 error elements that carry the signature, or the signed request's bytes in hex.
    static let credentialElements = ["SignatureProvided", "CanonicalRequestBytes", "StringToSignBytes"]
    /// Values shorter than this are not taken for secrets: replacing them would mangle the body for
    /// nothing a guess could not give.
    static let minimumSecretLength = 8

    /// The strings a signer's `signature` gave that are secrets, in each form a server may repeat
    /// them in: the values of the query parameters it added to (or changed in) the `planned` URL,
    /// as written, percent-decoded, and re-encoded as SigV4 encodes them; and its header values.
    public static func secrets(of signature: Signature, planned: PlannedRequest) -> Set<String> {
        let before = Set(rawQuery(of: planned.url).map { "\($0.name)=\($0.value)" })
        var found: Set<String> = []
        for (name, value) in rawQuery(of: signature.url) where !before.contains("\(name)=\(value)") {
            let decodedName = SignTarget.percentDecoded(Substring(name)).asciiLowercased
            guard !publicParameters.contains(decodedName) else { continue }
            let decoded = SignTarget.percentDecoded(Substring(value))
            for form in [value, decoded, S3Upload.escape(decoded), xmlEscaped(decoded)]
            where form.utf8.count >= minimumSecretLength {
                found.insert(form)
            }
        }
        for (_, value) in signature.headers where value.utf8.count >= minimumSecretLength {
            found.insert(value)
            found.insert(xmlEscaped(value))
        }
        return found
    }

    /// `headers` and `body` with every occurrence of `secrets` replaced by `[redacted]`, and the
    /// values of S3's credential query parameters and error elements too, whoever signed.
    public static func redact(
        headers: [(String, String)], body: [UInt8], secrets: Set<String>
    ) -> (headers: [(String, String)], body: [UInt8]) {
        // Longest first: a secret that contains another is replaced whole.
        let needles = secrets.map { Array($0.utf8) }.sorted { $0.count > $1.count }
        // Without secrets, only a header that names an `x-amz-` parameter is copied and rewritten:
        // most answers' headers pass untouched.
        var shownHeaders = headers
        for index in headers.indices where !needles.isEmpty || mentionsAmz(headers[index].1) {
            shownHeaders[index].1 = String(decoding: redact(Array(headers[index].1.utf8), needles), as: UTF8.self)
        }
        guard !body.isEmpty else { return (shownHeaders, body) }
        return (shownHeaders, redact(body, needles))
    }

    private static let marker = Array(HeaderRules.redactedValue.utf8)

    /// Each pass first looks for what it replaces, so a body without any (most answers) is
    /// scanned without being copied.
    private static func redact(_ text: [UInt8], _ needles: [[UInt8]]) -> [UInt8] {
        var out = text
        for needle in needles where firstIndex(of: needle, in: out, from: 0) != nil { out = replacing(needle, in: out) }
        if containsIgnoringCase(amzPrefix, out) {
            for name in credentialParameters { out = redactParameter(name, in: out) }
        }
        for element in credentialElements where firstIndex(of: Array("<\(element)>".utf8), in: out, from: 0) != nil {
            out = redactElement(element, in: out)
        }
        return out
    }

    private static let amzPrefix = Array("x-amz-".utf8)

    private static func mentionsAmz(_ value: String) -> Bool {
        var text = value
        return text.withUTF8 { containsIgnoringCase(amzPrefix, $0) }
    }

    private static func containsIgnoringCase<Text: RandomAccessCollection<UInt8>>(_ key: [UInt8], _ text: Text) -> Bool
    where Text.Index == Int {
        guard text.count >= key.count else { return false }
        for index in 0...(text.count - key.count) where matchesIgnoringCase(key, text, at: index) { return true }
        return false
    }

    /// Every occurrence of `needle` replaced by the marker.
    private static func replacing(_ needle: [UInt8], in text: [UInt8]) -> [UInt8] {
        guard !needle.isEmpty, text.count >= needle.count else { return text }
        var out: [UInt8] = []
        var index = 0
        var changed = false
        while index < text.count {
            if text[index] == needle[0], index + needle.count <= text.count,
                text[index..<index + needle.count].elementsEqual(needle)
            {
                out.append(contentsOf: marker)
                index += needle.count
                changed = true
            } else {
                out.append(text[index])
                index += 1
            }
        }
        return changed ? out : text
    }

    /// The value after each `name=` (the name in any case) up to the next `&`, quote, `<` or
    /// white space, replaced by the marker.
    private static func redactParameter(_ name: String, in text: [UInt8]) -> [UInt8] {
        let key = Array((name + "=").utf8)
        guard text.count > key.count else { return text }
        var out: [UInt8] = []
        var index = 0
        var changed = false
        while index < text.count {
            guard index + key.count <= text.count, matchesIgnoringCase(key, text, at: index) else {
                out.append(text[index])
                index += 1
                continue
            }
            out.append(contentsOf: text[index..<index + key.count])
            index += key.count
            let start = index
            while index < text.count, !isValueEnd(text[index]) { index += 1 }
            if index > start {
                out.append(contentsOf: marker)
                changed = true
            }
        }
        return changed ? out : text
    }

    /// The content of each `<element>…</element>` replaced by the marker.
    private static func redactElement(_ element: String, in text: [UInt8]) -> [UInt8] {
        let open = Array("<\(element)>".utf8)
        let close = Array("</\(element)>".utf8)
        var out: [UInt8] = []
        var index = 0
        var changed = false
        while index < text.count {
            guard index + open.count <= text.count, text[index..<index + open.count].elementsEqual(open),
                let end = firstIndex(of: close, in: text, from: index + open.count)
            else {
                out.append(text[index])
                index += 1
                continue
            }
            out.append(contentsOf: open)
            out.append(contentsOf: marker)
            out.append(contentsOf: close)
            index = end + close.count
            changed = true
        }
        return changed ? out : text
    }

    private static func firstIndex(of needle: [UInt8], in text: [UInt8], from start: Int) -> Int? {
        var index = start
        while index + needle.count <= text.count {
            if text[index..<index + needle.count].elementsEqual(needle) { return index }
            index += 1
        }
        return nil
    }

    private static func matchesIgnoringCase<Text: RandomAccessCollection<UInt8>>(
        _ key: [UInt8], _ text: Text, at index: Int
    ) -> Bool where Text.Index == Int {
        for offset in key.indices {
            var byte = text[index + offset]
            if (65...90).contains(byte) { byte += 32 }
            if byte != key[offset] { return false }
        }
        return true
    }

    private static func isValueEnd(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "&"), UInt8(ascii: "\""), UInt8(ascii: "'"), UInt8(ascii: "<"), UInt8(ascii: " "),
            UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"):
            return true
        default:
            return false
        }
    }

    /// The query's `name=value` pairs as written (a name alone has the value "").
    static func rawQuery(of url: String) -> [(name: String, value: String)] {
        guard let mark = url.firstIndex(of: "?") else { return [] }
        let query = url[url.index(after: mark)...].prefix { $0 != "#" }
        return query.split(separator: "&").map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            return (String(parts[0]), parts.count > 1 ? String(parts[1]) : "")
        }
    }

    /// `text` as XML writes it in element content.
    static func xmlEscaped(_ text: String) -> String {
        text.replacing("&", with: "&amp;").replacing("<", with: "&lt;").replacing(">", with: "&gt;")
            .replacing("\"", with: "&quot;").replacing("'", with: "&apos;")
    }
}
