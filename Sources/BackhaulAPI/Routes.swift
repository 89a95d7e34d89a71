/// The one route table. Every endpoint of the API is listed here, and in OpenAPI/backhaul.yaml.
extension API {
    public var routes: [Route] {
        [
            Route("GET", "/healthz", health),
            Route("GET", "/readyz", ready),
            Route("GET", "/v1/info", info),
            Route("GET", "/metrics", metrics),
            Route("GET", "/v1/sessions", listSessions),
            Route("PUT", "/v1/sessions/{id}", putSession),
            Route("GET", "/v1/sessions/{id}", getSession),
            Route("PATCH", "/v1/sessions/{id}", patchSession),
            Route("DELETE", "/v1/sessions/{id}", deleteSession),
            Route("POST", "/v1/sessions/{id}/tasks", createTasks),
            Route("GET", "/v1/sessions/{id}/tasks", listTasks),
            Route("GET", "/v1/tasks/{id}", getTask),
            Route("PATCH", "/v1/tasks/{id}", patchTask),
            Route("DELETE", "/v1/tasks/{id}", deleteTask),
            Route("POST", "/v1/tasks/{id}/cancel") { (request) throws(Problem) in try self.command(.cancel, request) },
            Route("POST", "/v1/tasks/{id}/suspend") { (request) throws(Problem) in try self.command(.suspend, request) },
            Route("POST", "/v1/tasks/{id}/resume") { (request) throws(Problem) in try self.command(.resume, request) },
            Route("POST", "/v1/sessions/{id}/webhooks", createWebhook),
            Route("GET", "/v1/sessions/{id}/webhooks", listWebhooks),
            Route("GET", "/v1/webhooks/{id}", getWebhook),
            Route("PATCH", "/v1/webhooks/{id}", patchWebhook),
            Route("DELETE", "/v1/webhooks/{id}", deleteWebhook),
            Route("POST", "/v1/webhooks/{id}/rotate", rotateWebhookSecret),
            Route("GET", "/v1/webhooks/{id}/deliveries", listDeliveries),
            Route("GET", "/v1/events", events),
            Route("GET", "/v1/network", getNetwork),
            Route("PUT", "/v1/network", putNetwork),
            Route("DELETE", "/v1/network", deleteNetwork),
            Route("GET", "/v1/policy", getPolicy),
            Route("PUT", "/v1/policy", putPolicy),
            Route("DELETE", "/v1/policy", deletePolicy),
        ]
    }
}
