import CSystemd
import Glibc

/// An sd-bus error: the negative errno of the call and, for a method that failed on the other
/// side, its D-Bus error name and message.
public struct BusError: Error, Sendable, CustomStringConvertible {
    public var call: String
    public var errno: Int32
    public var name: String?
    public var message: String?

    public var description: String {
        var text = "\(call): \(String(cString: strerror(errno)))"
        if let name { text += " (\(name)" + (message.map { ": " + $0 } ?? "") + ")" }
        return text
    }
}

/// A property value as read from the bus: the basic types and arrays of them; anything else is
/// `.unsupported` with its signature.
public enum BusValue: Sendable, Equatable {
    case uint32(UInt32)
    case int32(Int32)
    case bool(Bool)
    case string(String)
    case objectPath(String)
    case array([BusValue])
    case unsupported(String)

    public var uint32: UInt32? { if case .uint32(let value) = self { value } else { nil } }
    /// A string or an object path.
    public var string: String? {
        switch self {
        case .string(let value), .objectPath(let value): value
        default: nil
        }
    }
    public var objectPaths: [String]? {
        guard case .array(let items) = self else { return nil }
        let paths = items.compactMap { if case .objectPath(let path) = $0 { path } else { nil } }
        return paths.count == items.count ? paths : nil
    }
}

/// A connection to the system bus (sd-bus, which honours `DBUS_SYSTEM_BUS_ADDRESS`): an owned
/// `sd_bus *`, used from one thread only (sd-bus is not thread-safe). Every method call is
/// bounded by `callTimeout`. Only non-variadic calls are used (Swift cannot call C variadics).
public final class SystemBus {
    private let bus: OpaquePointer
    private var slots: [OpaquePointer] = []
    /// Set by the signal trampoline; `takeSignalled` reads and clears it.
    fileprivate var signalled = false

    /// Connects; throws when no bus answers.
    public init(callTimeout: Double) throws(BusError) {
        var handle: OpaquePointer?
        let result = sd_bus_open_system(&handle)
        guard result >= 0, let handle else { throw BusError(call: "sd_bus_open_system", errno: -result) }
        bus = handle
        sd_bus_set_method_call_timeout(bus, UInt64(callTimeout * 1_000_000))
    }

    deinit {
        for slot in slots { sd_bus_slot_unref(slot) }
        sd_bus_flush_close_unref(bus)
    }

    /// Every property of `interface` on `path` of `destination` (`Properties.GetAll`); values of
    /// types this reader does not take come back `.unsupported`.
    public func properties(destination: String, path: String, interface: String) throws(BusError) -> [String: BusValue] {
        let reply = try call(
            destination: destination, path: path, interface: "org.freedesktop.DBus.Properties", member: "GetAll",
            argument: interface)
        defer { sd_bus_message_unref(reply) }
        var result: [String: BusValue] = [:]
        try check(sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "a")), "{sv}"), "enter a{sv}")
        while true {
            let entered = sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "e")), "sv")
            try check(entered, "enter {sv}")
            if entered == 0 { break }
            var key: UnsafePointer<CChar>?
            try check(sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "s")), &key), "read a property name")
            let name = key.map { String(cString: $0) } ?? ""
            var kind: CChar = 0
            var contents: UnsafePointer<CChar>?
            try check(sd_bus_message_peek_type(reply, &kind, &contents), "peek a variant")
            let signature = contents.map { String(cString: $0) } ?? ""
            try check(sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "v")), signature), "enter a variant")
            result[name] = try readValue(reply, signature: signature)
            try check(sd_bus_message_exit_container(reply), "leave a variant")
            try check(sd_bus_message_exit_container(reply), "leave {sv}")
        }
        try check(sd_bus_message_exit_container(reply), "leave a{sv}")
        return result
    }

    /// Whether `name` has an owner on the bus (`org.freedesktop.DBus.NameHasOwner`).
    public func nameHasOwner(_ name: String) throws(BusError) -> Bool {
        let reply = try call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameHasOwner", argument: name)
        defer { sd_bus_message_unref(reply) }
        var value: Int32 = 0
        try check(sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "b")), &value), "read NameHasOwner")
        return value != 0
    }

    /// Marks this bus signalled whenever a message matching `rule` (a D-Bus match rule) arrives;
    /// `takeSignalled` tells. The rule's slot lives as long as the bus.
    public func watch(_ rule: String) throws(BusError) {
        var slot: OpaquePointer?
        let userdata = Unmanaged.passUnretained(self).toOpaque()
        try check(
            sd_bus_add_match(
                bus, &slot, rule,
                { _, userdata, _ in
                    guard let userdata else { return 0 }
                    Unmanaged<SystemBus>.fromOpaque(userdata).takeUnretainedValue().signalled = true
                    return 0
                }, userdata), "sd_bus_add_match")
        if let slot { slots.append(slot) }
    }

    /// Waits up to `timeout` seconds for traffic and processes what came (the match callbacks
    /// run here); throws when the connection is lost.
    public func wait(timeout: Double) throws(BusError) {
        var processed: Int32 = 1
        var rounds = 0
        // Messages already queued are taken before waiting, at most 1,000 per call.
        while processed > 0 && rounds < 1000 {
            processed = sd_bus_process(bus, nil)
            try check(processed, "sd_bus_process")
            rounds += 1
        }
        let waited = sd_bus_wait(bus, UInt64(timeout * 1_000_000))
        if waited < 0 && waited != -EINTR { try check(waited, "sd_bus_wait") }
        rounds = 0
        processed = 1
        while processed > 0 && rounds < 1000 {
            processed = sd_bus_process(bus, nil)
            try check(processed, "sd_bus_process")
            rounds += 1
        }
    }

    /// Whether a watched rule matched since the last call.
    public func takeSignalled() -> Bool {
        defer { signalled = false }
        return signalled
    }

    private func call(destination: String, path: String, interface: String, member: String, argument: String)
        throws(BusError) -> OpaquePointer
    {
        var message: OpaquePointer?
        try check(sd_bus_message_new_method_call(bus, &message, destination, path, interface, member), "new \(member)")
        defer { sd_bus_message_unref(message) }
        try check(
            argument.withCString { sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), $0) }, "append to \(member)")
        var error = bh_sd_bus_error_null()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        let result = sd_bus_call(bus, message, 0, &error, &reply)
        guard result >= 0, let reply else {
            throw BusError(
                call: "\(member) \(path)", errno: -result, name: error.name.map { String(cString: $0) },
                message: error.message.map { String(cString: $0) })
        }
        return reply
    }

    /// One value of `signature` at the reader's position: a basic type, or an array of them.
    private func readValue(_ message: OpaquePointer, signature: String) throws(BusError) -> BusValue {
        guard let first = signature.utf8.first else { return .unsupported(signature) }
        switch first {
        case UInt8(ascii: "u"):
            var value: UInt32 = 0
            try check(sd_bus_message_read_basic(message, CChar(first), &value), "read u")
            return .uint32(value)
        case UInt8(ascii: "i"):
            var value: Int32 = 0
            try check(sd_bus_message_read_basic(message, CChar(first), &value), "read i")
            return .int32(value)
        case UInt8(ascii: "b"):
            var value: Int32 = 0
            try check(sd_bus_message_read_basic(message, CChar(first), &value), "read b")
            return .bool(value != 0)
        case UInt8(ascii: "s"), UInt8(ascii: "o"):
            var value: UnsafePointer<CChar>?
            try check(sd_bus_message_read_basic(message, CChar(first), &value), "read s")
            let text = value.map { String(cString: $0) } ?? ""
            return first == UInt8(ascii: "o") ? .objectPath(text) : .string(text)
        case UInt8(ascii: "a") where signature.utf8.count == 2 && "uibso".utf8.contains(signature.utf8.last ?? 0):
            let element = String(signature.dropFirst())
            try check(sd_bus_message_enter_container(message, CChar(first), element), "enter an array")
            var items: [BusValue] = []
            while items.count < 4096 {
                var kind: CChar = 0
                var contents: UnsafePointer<CChar>?
                let more = sd_bus_message_peek_type(message, &kind, &contents)
                try check(more, "peek an array")
                if more == 0 { break }
                items.append(try readValue(message, signature: element))
            }
            try check(sd_bus_message_exit_container(message), "leave an array")
            return .array(items)
        default:
            try check(sd_bus_message_skip(message, signature), "skip \(signature)")
            return .unsupported(signature)
        }
    }

    private func check(_ result: Int32, _ call: String) throws(BusError) {
        if result < 0 { throw BusError(call: call, errno: -result) }
    }
}
