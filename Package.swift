// swift-tools-version: 6.0
import PackageDescription

/// One settings array for every Swift target.
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny")
]

let package = Package(
    name: "Backhaul",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "backhauld", targets: ["backhauld"]),
        .executable(name: "backhaul", targets: ["backhaul"]),
        .library(name: "BackhaulServer", targets: ["BackhaulServer"]),
        /// The API from Swift: async calls, Codable models (docs/client.md).
        .library(name: "BackhaulClient", targets: ["BackhaulClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
    ],
    targets: [
        // C libraries: module map + shim.h, typed wrappers only.
        .systemLibrary(name: "CCurl", path: "Sources/CCurl"),
        .systemLibrary(name: "CMicroHTTPD", path: "Sources/CMicroHTTPD"),
        .systemLibrary(name: "CJSONC", path: "Sources/CJSONC"),
        .systemLibrary(name: "CSQLite", path: "Sources/CSQLite"),
        .systemLibrary(name: "COpenSSL", path: "Sources/COpenSSL"),
        /// libpq: PostgreSQL's client library.
        .systemLibrary(name: "CLibPQ", path: "Sources/CLibPQ"),
        /// libsystemd: sd_notify(3) and sd-bus.
        .systemLibrary(name: "CSystemd", path: "Sources/CSystemd"),
        /// What Swift's Glibc module leaves out: getrandom(2), mallopt(3), pthread_setname_np(3)
        /// (the C library's; nothing to link).
        .systemLibrary(name: "CGlibc", path: "Sources/CGlibc"),

        // Domain-free Swift wrappers: the only places that see C pointers.
        .target(name: "Curl", dependencies: ["CCurl", "Threads"], swiftSettings: swiftSettings),
        .target(name: "MicroHTTP", dependencies: ["CMicroHTTPD", "Threads"], swiftSettings: swiftSettings),
        .target(name: "SQLite", dependencies: ["CSQLite"], swiftSettings: swiftSettings),
        .target(name: "PostgreSQL", dependencies: ["CLibPQ"], swiftSettings: swiftSettings),
        /// The JSON value type: pure Swift, what the domain holds.
        .target(name: "JSONValue", swiftSettings: swiftSettings),
        /// Parsing and printing JSON through json-c (re-exports the value type).
        .target(name: "JSONCodec", dependencies: ["JSONValue", "CJSONC"], swiftSettings: swiftSettings),
        .target(name: "Digest", dependencies: ["COpenSSL"], swiftSettings: swiftSettings),
        /// systemd's notify protocol and the D-Bus system bus through sd-bus.
        .target(name: "Systemd", dependencies: ["CSystemd", "Threads"], swiftSettings: swiftSettings),
        /// pthread locks and threads, the kernel's random bytes, the allocator's thresholds.
        .target(name: "Threads", dependencies: ["CGlibc"], swiftSettings: swiftSettings),

        // The dashboard's HTML, CSS and JavaScript, embedded in the binary at build time.
        .target(
            name: "BackhaulUI", dependencies: ["Digest"],
            resources: [
                .embedInCode("Assets/index.html"), .embedInCode("Assets/app.css"), .embedInCode("Assets/icon.svg"),
                // The script: app.js and the ES modules it imports.
                .embedInCode("Assets/app.js"), .embedInCode("Assets/api.js"), .embedInCode("Assets/stream.js"),
                .embedInCode("Assets/snapshots.js"), .embedInCode("Assets/view.js"), .embedInCode("Assets/panels.js"),
                .embedInCode("Assets/actions.js"), .embedInCode("Assets/words.js"), .embedInCode("Assets/page.js"),
            ],
            swiftSettings: swiftSettings),

        // Backhaul's domain, inward to outward. Core is pure: no file, network or thread I/O.
        .target(name: "BackhaulCore", dependencies: ["JSONValue", "Threads"], swiftSettings: swiftSettings),
        /// The file system as tasks see it: allowed roots, files opened for upload, `.part` files.
        .target(name: "BackhaulFiles", dependencies: ["BackhaulCore", "Digest", "Threads"], swiftSettings: swiftSettings),
        .target(
            name: "BackhaulQueue",
            dependencies: ["BackhaulCore", "JSONCodec", "Threads"],
            swiftSettings: swiftSettings),
        /// The state in one SQLite database: the single node's store (docs/architecture.md).
        .target(
            name: "BackhaulSQLite", dependencies: ["BackhaulCore", "BackhaulQueue", "JSONCodec", "SQLite", "Threads"],
            swiftSettings: swiftSettings),
        /// The fleet's shared queue in PostgreSQL: schema, claims, leases, takeover (docs/fleet.md).
        .target(
            name: "BackhaulPostgres", dependencies: ["BackhaulCore", "BackhaulQueue", "JSONCodec", "PostgreSQL", "Threads"],
            swiftSettings: swiftSettings),
        .target(
            name: "BackhaulEngine",
            dependencies: [
                "BackhaulCore", "BackhaulQueue", "BackhaulFiles", "Curl", "Digest", "JSONCodec", "Systemd", "Threads",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .target(
            name: "BackhaulWebhooks",
            dependencies: [
                "BackhaulCore", "BackhaulQueue", "Curl", "Digest", "Threads", .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .target(
            name: "BackhaulAPI",
            dependencies: [
                "BackhaulCore", "BackhaulQueue", "BackhaulFiles", "BackhaulUI", "Digest", "JSONCodec", "MicroHTTP", "Threads",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .target(
            name: "BackhaulServer",
            dependencies: [
                "BackhaulCore", "BackhaulQueue", "BackhaulSQLite", "BackhaulPostgres", "BackhaulEngine", "BackhaulWebhooks",
                "BackhaulAPI",
                "BackhaulFiles",
                "MicroHTTP", "Systemd",
                "JSONCodec", "Threads", .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .executableTarget(name: "backhauld", dependencies: ["BackhaulServer"], swiftSettings: swiftSettings),

        // The client library: the API's calls and models over libcurl, without the daemon's domain.
        .target(name: "BackhaulClient", dependencies: ["Curl", "Threads"], swiftSettings: swiftSettings),
        /// docs/client.md's example program, built so that the tests run it.
        .executableTarget(
            name: "backhaul-client-example", dependencies: ["BackhaulClient"], path: "Examples/ClientExample",
            swiftSettings: swiftSettings),

        // The command-line client: the API through BackhaulClient, human tables or JSON.
        .target(
            name: "BackhaulCLI",
            dependencies: [
                "BackhaulClient", "BackhaulCore", "JSONCodec", .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings),
        .executableTarget(name: "backhaul", dependencies: ["BackhaulCLI"], swiftSettings: swiftSettings),

        // Loopback peers for tests: a recording sink that misbehaves on cue, a daemon runner.
        .target(
            name: "BackhaulTesting",
            dependencies: ["MicroHTTP", "Curl", "JSONCodec", "BackhaulCore", "Digest", "PostgreSQL", "Threads"],
            swiftSettings: swiftSettings),

        .testTarget(
            name: "BackhaulCoreTests",
            dependencies: ["BackhaulCore", "BackhaulFiles", "BackhaulWebhooks", "Digest", "JSONCodec", "Threads"],
            swiftSettings: swiftSettings),
        .testTarget(name: "CurlTests", dependencies: ["Curl"], swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulCLITests", dependencies: ["BackhaulCLI", "BackhaulClient", "BackhaulTesting", "JSONCodec"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulClientTests",
            dependencies: ["BackhaulClient", "BackhaulTesting", "JSONCodec", "Threads", "backhauld", "backhaul-client-example"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulServerTests",
            dependencies: [
                "BackhaulServer", "BackhaulAPI", "BackhaulCore", "JSONCodec", "Threads",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .testTarget(name: "SQLiteTests", dependencies: ["SQLite", "CSQLite"], swiftSettings: swiftSettings),
        .testTarget(
            name: "PostgreSQLTests", dependencies: ["PostgreSQL", "BackhaulTesting"], swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulPostgresTests",
            dependencies: ["BackhaulCore", "BackhaulPostgres", "BackhaulQueue", "BackhaulTesting", "PostgreSQL", "Threads"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulStoreTests",
            dependencies: [
                "BackhaulQueue", "BackhaulSQLite", "BackhaulPostgres", "BackhaulCore", "BackhaulTesting", "JSONCodec",
                "PostgreSQL",
                "SQLite",
                "Threads",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulEngineTests", dependencies: ["BackhaulEngine", "BackhaulQueue", "BackhaulTesting", "Threads"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "BackhaulAPITests",
            dependencies: [
                "BackhaulAPI", "BackhaulQueue", "BackhaulSQLite", "BackhaulCore", "BackhaulEngine", "BackhaulFiles", "BackhaulUI",
                "JSONCodec",
                "Threads",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "BackhaulTesting", "JSONCodec", "BackhaulCore", "Digest", "PostgreSQL", "Threads", "BackhaulCLI", "backhauld",
                "backhaul",
            ],
            swiftSettings: swiftSettings),
    ]
)

// The fuzz targets (docs/security.md): one libFuzzer binary, declared only when `make fuzz`
// builds it (BACKHAUL_FUZZ=1, with -Xswiftc -sanitize=fuzzer,address into .build-fuzz).
if Context.environment["BACKHAUL_FUZZ"] != nil {
    package.targets.append(
        .executableTarget(
            name: "backhaul-fuzz",
            dependencies: [
                "BackhaulCore", "BackhaulFiles", "BackhaulQueue", "BackhaulSQLite", "BackhaulPostgres", "BackhaulEngine",
                "BackhaulAPI", "BackhaulServer",
                "JSONCodec", "MicroHTTP", "Systemd", .product(name: "Logging", package: "swift-log"),
            ],
            path: "Fuzz/Sources", swiftSettings: swiftSettings + [.unsafeFlags(["-parse-as-library"])]))
}
