import BackhaulClient

/// Exit codes scripts can rely on.
public enum ExitStatus: Int32, Sendable {
    case ok = 0
    /// The API refused the request (a problem+json answer), or answered what cannot be read.
    case refused = 1
    /// Bad command-line usage (ArgumentParser's own code).
    case usage = 64
    /// `--wait` saw the task end failed or cancelled.
    case taskUnsuccessful = 3
    /// The daemon could not be reached.
    case unreachable = 4
}

/// A failure that ends the command with an exit status and a message on stderr.
public struct CLIError: Error, CustomStringConvertible {
    public var status: ExitStatus
    public var description: String

    public init(status: ExitStatus, description: String) {
        self.status = status
        self.description = description
    }

    /// What an API error ends a command with: a problem's detail and code (1), a daemon out of
    /// reach (4), an answer that cannot be read (1).
    public init(_ error: APIError) {
        switch error {
        case .problem: self.init(status: .refused, description: error.description)
        case .transport: self.init(status: .unreachable, description: error.description)
        case .unexpectedAnswer, .invalidRequest: self.init(status: .refused, description: error.description)
        }
    }
}
