/* routes.c - paths to handlers.  Query strings are already cut off by http.c
 * (`/v1/messages?beta=true` routes as `/v1/messages`). */
#include <string.h>

#include "server/server.h"

void srv_route(const srv_request *q, srv_reply *r) {
    const char *p = q->path, *m = q->method;
    int get = !strcmp(m, "GET") || !strcmp(m, "HEAD"), post = !strcmp(m, "POST");
    if (get && (!strcmp(p, "/") || !strcmp(p, "/index.html")) && !q->srv->opt.no_webui) return srv_chat_page(q, r);
    if (get && !strcmp(p, "/health")) return srv_health(q, r);
    if (get && !strcmp(p, "/ready")) return srv_ready(q, r);
    if (get && !strcmp(p, "/status")) return srv_status(q, r);
    if (get && !strcmp(p, "/metrics")) return srv_metrics(q, r);
    if (get && (!strcmp(p, "/v1/models") || !strcmp(p, "/models"))) return srv_models(q, r);
    if (get && !strncmp(p, "/v1/models/", 11)) return srv_model_one(q, r, p + 11);
    if (post && !strcmp(p, "/tokenize")) return srv_tokenize(q, r);
    if (post && !strcmp(p, "/apply-template")) return srv_apply_template(q, r);
    if (post && (!strcmp(p, "/v1/chat/completions") || !strcmp(p, "/chat/completions")))
        return srv_chat_completions(q, r);
    if (post && (!strcmp(p, "/v1/completions") || !strcmp(p, "/completions"))) return srv_completions(q, r);
    if (srv_route_anthropic(q, r) || srv_route_responses(q, r)) return;
    if (!strcmp(p, "/v1/completions")) {
        srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", m, p);
        return;
    }
    if ((!strcmp(p, "/") || !strcmp(p, "/index.html")) && !q->srv->opt.no_webui) {
        srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", m, p);
        return;
    }
    static const char *known[] = {"/health", "/ready", "/status", "/metrics", "/v1/models", "/tokenize",
                                  "/apply-template", "/v1/chat/completions"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(p, known[i])) {
            srv_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %s", m, p);
            return;
        }
    srv_error(r, 404, NULL, "not_found", "no route for %s %.200s", m, p);
}
