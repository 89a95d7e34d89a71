/// The one route table, with what each route needs from the caller when tokens are on. Every
/// endpoint of the API is listed here, and in OpenAPI/backhaul.yaml.
extension API {
    public var routes: [Route] {
        [
            Route("GET", "/healthz", .open, health),
            Route("GET", "/readyz", .open, ready),
            Route("GET", "/v1/info", .authenticated, info),
            Route("GET", "/v1/nodes", .authenticated, nodes),
            Route("GET", "/metrics", .authenticated, metrics),
            Route("GET", "/v1/sessions", .authenticated, listSessions),
            Route("PUT", "/v1/sessions/{id}", .session, putSession),
            Route("GET", "/v1/sessions/{id}", .session, getSession),
            Route("PATCH", "/v1/sessions/{id}", .session, patchSession),
            Route("DELETE", "/v1/sessions/{id}", .session, deleteSession),
            Route("POST", "/v1/sessions/{id}/tasks", .session, createTasks),
            Route("GET", "/v1/sessions/{id}/tasks", .session, listTasks),
            Route("GET", "/v1/tasks/{id}", .task, getTask),
            Route("PATCH", "/v1/tasks/{id}", .task, patchTask),
            Route("DELETE", "/v1/tasks/{id}", .task, deleteTask),
            Route("GET", "/v1/tasks/{id}/attempts", .task, listAttempts),
            Route("POST", "/v1/tasks/{id}/cancel", .task) { (request) throws(Problem) in try self.command(.cancel, request) },
            Route("POST", "/v1/tasks/{id}/suspend", .task) { (request) throws(Problem) in try self.command(.suspend, request) },
            Route("POST", "/v1/tasks/{id}/resume", .task) { (request) throws(Problem) in try self.command(.resume, request) },
            Route("POST", "/v1/sessions/{id}/webhooks", .session, createWebhook),
            Route("GET", "/v1/sessions/{id}/webhooks", .session, listWebhooks),
            Route("GET", "/v1/webhooks/{id}", .webhook, getWebhook),
            Route("PATCH", "/v1/webhooks/{id}", .webhook, patchWebhook),
            Route("DELETE", "/v1/webhooks/{id}", .webhook, deleteWebhook),
            Route("POST", "/v1/webhooks/{id}/rotate", .webhook, rotateWebhookSecret),
            Route("GET", "/v1/webhooks/{id}/deliveries", .webhook, listDeliveries),
            Route("GET", "/v1/events", .authenticated, events),
            Route("GET", "/v1/network", .authenticated, getNetwork),
            Route("PUT", "/v1/network", .admin, putNetwork),
            Route("DELETE", "/v1/network", .admin, deleteNetwork),
            Route("GET", "/v1/policy", .authenticated, getPolicy),
            Route("PUT", "/v1/policy", .admin, putPolicy),
            Route("DELETE", "/v1/policy", .admin, deletePolicy),
            Route("POST", "/v1/admin/backup", .admin, backup),
            Route("GET", "/", .open, dashboardPage),
            Route("GET", "/ui/{file}", .open, dashboardFile),
        ].filter { options.dashboard || !$0.isDashboard }
    }
}
