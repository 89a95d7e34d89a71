// swift-tools-version: 6.1
// The IETF resumable-upload test peer: Apple's NIOResumableUpload (swift-nio-extras) behind a
// small executable of our own. A package of its own so that the daemon never depends on NIO;
// `make test` builds it into `.build-ietfpeer` (see the Makefile).
import PackageDescription

let package = Package(
    name: "IETFPeer",
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.94.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", "1.35.2"..<"1.36.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.3.0"),
    ],
    targets: [
        /// SHA-256 from libcrypto, to check `Repr-Digest` (libssl-dev, as for the daemon).
        .systemLibrary(name: "CPeerCrypto", path: "Sources/CPeerCrypto"),
        .executableTarget(
            name: "IETFPeer",
            dependencies: [
                "CPeerCrypto",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOResumableUpload", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            swiftSettings: [.swiftLanguageMode(.v5)]),
    ]
)
