import JSONValue

/// AWS credentials as a source gave them (docs/credentials.md): long-lived keys, or temporary ones with a
/// session token and an `Expiration`.
public struct AWSCredentials: Sendable, Equatable {
    public var accessKeyID: String
    public var secretAccessKey: String
    public var sessionToken: String?
    /// When they stop working (Unix seconds); nil for keys that do not expire.
    public var expiration: Timestamp?

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil, expiration: Timestamp? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
        self.expiration = expiration
    }

    /// Temporary credentials are renewed this long before their `Expiration`.
    public static let renewalMargin: Double = 300

    /// Whether they should be renewed before use at `now`.
    public func due(now: Timestamp) -> Bool {
        expiration.map { now >= $0 - Self.renewalMargin } ?? false
    }

    /// Whether they still work at `now` (a renewal that fails may go on using them until then).
    public func valid(now: Timestamp) -> Bool { expiration.map { now < $0 } ?? true }

    /// The container endpoint's answer (ECS, EKS Pod Identity):
    /// `{"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}`; IMDS answers the same shape.
    public static func fromContainerAnswer(_ value: JSON) -> AWSCredentials? {
        fields(value, token: "Token")
    }

    /// What a `credential_process` prints: `{"Version": 1, "AccessKeyId", "SecretAccessKey",
    /// "SessionToken", "Expiration"}`.
    public static func fromProcessOutput(_ value: JSON) -> AWSCredentials? {
        guard value["Version"]?.intValue == 1 else { return nil }
        return fields(value, token: "SessionToken")
    }

    private static func fields(_ value: JSON, token: String) -> AWSCredentials? {
        guard let key = value["AccessKeyId"]?.stringValue, !key.isEmpty, !key.contains(":"),
            let secret = value["SecretAccessKey"]?.stringValue, !secret.isEmpty
        else { return nil }
        var expiration: Timestamp?
        if let text = value["Expiration"]?.stringValue {
            guard let parsed = RFC3339.parse(text) else { return nil }
            expiration = parsed
        }
        let session = value[token]?.stringValue
        return AWSCredentials(
            accessKeyID: key, secretAccessKey: secret, sessionToken: session?.isEmpty == true ? nil : session,
            expiration: expiration)
    }
}

/// The AWS shared credentials and config files: INI sections of `key = value` lines.
public enum AWSSharedFiles {
    /// The keys of one profile: `[name]` in the credentials file, `[profile name]` (or
    /// `[default]`) in the config file. Comments start with `#` or `;`.
    public static func profile(_ name: String, in text: String, config: Bool) -> [String: String]? {
        let wanted = config && name != "default" ? "profile \(name)" : name
        var found: [String: String]?
        var inside = false
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmed()
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                let section = String(line.dropFirst().dropLast()).trimmed()
                    .split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
                inside = section == wanted
                if inside, found == nil { found = [:] }
                continue
            }
            guard inside, let equals = line.firstIndex(of: "=") else { continue }
            let key = String(line[..<equals]).trimmed().lowercased()
            found?[key] = String(line[line.index(after: equals)...]).trimmed()
        }
        return found
    }

    /// Static keys of a profile, if it has both.
    public static func keys(_ profile: [String: String]) -> AWSCredentials? {
        guard let key = profile["aws_access_key_id"], !key.isEmpty, let secret = profile["aws_secret_access_key"], !secret.isEmpty
        else { return nil }
        return AWSCredentials(accessKeyID: key, secretAccessKey: secret, sessionToken: profile["aws_session_token"])
    }
}

/// Web identity (IRSA on EKS): the token in `AWS_WEB_IDENTITY_TOKEN_FILE` is traded for keys by an
/// unsigned STS `AssumeRoleWithWebIdentity` of `AWS_ROLE_ARN` (docs/credentials.md).
public enum AWSWebIdentity {
    /// Where STS is asked: `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL` (the SDKs' service
    /// endpoint settings), else the region's endpoint (`AWS_REGION`, `AWS_DEFAULT_REGION`), else
    /// the global one.
    public static func endpoint(_ variable: (String) -> String?) -> String {
        if let url = variable("AWS_ENDPOINT_URL_STS") ?? variable("AWS_ENDPOINT_URL") { return url }
        if let region = variable("AWS_REGION") ?? variable("AWS_DEFAULT_REGION") { return "https://sts.\(region).amazonaws.com" }
        return "https://sts.amazonaws.com"
    }

    /// The form body of the request.
    public static func requestBody(roleARN: String, sessionName: String, token: String) -> [UInt8] {
        let fields = [
            ("Action", "AssumeRoleWithWebIdentity"), ("Version", "2011-06-15"), ("RoleArn", roleARN),
            ("RoleSessionName", sessionName), ("WebIdentityToken", token),
        ]
        return Array(fields.map { "\($0.0)=\(S3Upload.escape($0.1))" }.joined(separator: "&").utf8)
    }

    /// The keys of STS's answer (`<Credentials>` with `AccessKeyId`, `SecretAccessKey`,
    /// `SessionToken`, `Expiration`); nil when it holds none.
    public static func credentials(fromAnswer body: [UInt8]) -> AWSCredentials? {
        guard let block = XMLText.blocks("Credentials", in: body).first else { return nil }
        let inner = Array(block.utf8)
        guard let key = XMLText.first("AccessKeyId", in: inner), !key.isEmpty, !key.contains(":"),
            let secret = XMLText.first("SecretAccessKey", in: inner), !secret.isEmpty,
            let token = XMLText.first("SessionToken", in: inner), !token.isEmpty,
            let expiration = XMLText.first("Expiration", in: inner).flatMap(RFC3339.parse)
        else { return nil }
        return AWSCredentials(accessKeyID: key, secretAccessKey: secret, sessionToken: token, expiration: expiration)
    }
}
