import BackhaulCore
import BackhaulQueue
import JSONCodec
import MicroHTTP

/// `GET /v1/nodes` (docs/fleet.md): the daemons that share the state. One daemon on SQLite is a
/// fleet of one: itself.
extension API {
    @Sendable func nodes(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let fleet = try stored { () throws(StoreError) in try store.nodes() }
        let nodes =
            fleet?.map(API.nodeJSON)
            ?? [
                API.nodeJSON(
                    NodeRecord(
                        id: options.nodeID, version: BackhaulVersion.string, startedAt: options.startedAt,
                        lastHeartbeatAt: clock.now(), silentSeconds: 0, running: status?.metrics.running ?? 0,
                        network: status.map { $0.detectedNetwork(refresh: false).json.serialized() }))
            ]
        return API.json(200, ["nodes": .array(nodes)])
    }

    static func nodeJSON(_ node: NodeRecord) -> JSON {
        [
            "id": .string(node.id), "version": .string(node.version), "started_at": .string(RFC3339.format(node.startedAt)),
            "last_heartbeat_at": .string(RFC3339.format(node.lastHeartbeatAt)), "running": .int(Int64(node.running)),
            "network": node.network.flatMap { try? JSON.parse($0, maxDepth: 8) } ?? .null,
        ]
    }
}
