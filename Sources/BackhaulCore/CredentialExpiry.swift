/// Whether a refusal says the request's credentials or signature expired (docs/credentials.md), as S3 and
/// the services that copy its errors say it: `ExpiredToken` (a session token past its
/// `Expiration`), `TokenRefreshRequired`, and `AccessDenied` with "Request has expired" (a
/// presigned URL past its `X-Amz-Expires`). A 401 is the other way to want new credentials.
public enum CredentialExpiry {
    /// The error codes that mean expiry whatever their message.
    static let expiredCodes: Set<String> = ["ExpiredToken", "TokenRefreshRequired"]

    public static func says(_ response: ResponseHead) -> Bool {
        guard response.status == 403 || response.status == 400, !response.body.isEmpty,
            let code = XMLText.first("Code", in: response.body)
        else { return false }
        if expiredCodes.contains(code) { return true }
        guard response.status == 403, code == "AccessDenied", let message = XMLText.first("Message", in: response.body) else {
            return false
        }
        return message.lowercased().contains("request has expired")
    }
}
