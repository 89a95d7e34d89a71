// The fuzz targets' entry points for libFuzzer (docs/security.md). One binary holds every
// target; `BACKHAUL_FUZZ_TARGET` names the one a run drives. Built only by `make fuzz`
// (scripts/fuzz.sh) with `BACKHAUL_FUZZ=1 swift build -Xswiftc -sanitize=fuzzer,address`.
import Foundation

/// A fuzz target: the real parsing and decision code of one surface, fed one input.
struct FuzzTarget: Sendable {
    let name: String
    /// What the target reads (docs/security.md lists the same).
    let surface: String
    /// What the target sets up once, before the first input (outside libFuzzer's 1 s per input).
    var setUp: @Sendable () -> Void = {}
    let run: @Sendable (FuzzInput) -> Void
}

/// Every target, by name.
let targets: [FuzzTarget] = [
    apiTarget, decodeTarget, tokensTarget, configTarget,
    tusTarget, ietfTarget, chunkedTarget, singleTarget, s3Target, autoTarget, downloadTarget,
    headersTarget, xmlTarget, credentialsTarget, signerTarget, notifyTarget, rowTarget, dbusTarget,
]

nonisolated(unsafe) var selected: FuzzTarget?

@_cdecl("LLVMFuzzerInitialize")
public func fuzzInitialize(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>)
    -> CInt
{
    let name = ProcessInfo.processInfo.environment["BACKHAUL_FUZZ_TARGET"] ?? ""
    if name == "list" {
        for target in targets { print("\(target.name)\t\(target.surface)") }
        exit(0)
    }
    guard let target = targets.first(where: { $0.name == name }) else {
        FileHandle.standardError.write(
            Data("BACKHAUL_FUZZ_TARGET must name a target (list: BACKHAUL_FUZZ_TARGET=list)\n".utf8))
        exit(2)
    }
    selected = target
    target.setUp()
    return 0
}

/// SwiftPM links an executable with `main` set to `backhaul_fuzz_main` (its entry point, renamed so
/// that tests can link the module): here it hands over to libFuzzer's driver, as libFuzzer's own
/// `main` would.
@_cdecl("backhaul_fuzz_main")
public func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return fuzzerRunDriver(&count, &arguments) { data, size in
        guard let data else { return 0 }
        return fuzzTestOneInput(data, size)
    }
}

@_silgen_name("LLVMFuzzerRunDriver")
func fuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTestOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    selected?.run(FuzzInput(Array(UnsafeBufferPointer(start: data, count: size))))
    return 0
}

/// An input read as text: sections split by a line `%%`, each section's lines.
struct FuzzInput {
    let bytes: [UInt8]
    let text: String

    init(_ bytes: [UInt8]) {
        self.bytes = bytes
        self.text = String(decoding: bytes, as: UTF8.self)
    }

    /// The sections between lines that hold only `%%`.
    var sections: [String] {
        text.split(separator: "\n%%\n", omittingEmptySubsequences: false).map(String.init)
    }

    func section(_ index: Int) -> String {
        let all = sections
        return index < all.count ? all[index] : ""
    }
}

extension String {
    var lines: [String] { split(separator: "\n", omittingEmptySubsequences: false).map(String.init) }
}

/// A fuzz target's own check: a rule the code must keep whatever it is fed. Failing it stops the
/// run as a crash does, and libFuzzer keeps the input.
func require(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
    if !condition() {
        FileHandle.standardError.write(Data("fuzz check failed: \(message())\n".utf8))
        abort()
    }
}
