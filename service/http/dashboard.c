/* dashboard.c — the web dashboard's static files (see dashboard.h). */
#include "service/http/dashboard.h"

#include "service/http/http_util.h"

#include <string.h>

#define DASHBOARD_CSP                                                                                                  \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "              \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const struct {
    const char *path, *file, *type;
} routes[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/index.html", "index.html", "text/html; charset=utf-8"},
    {"/assets/app.js", "app.js", "text/javascript; charset=utf-8"},
    {"/assets/app.css", "app.css", "text/css; charset=utf-8"},
};

static const dashboard_asset *asset_named(const char *name)
{
    for (size_t i = 0; i < dashboard_asset_count; i++)
        if (!strcmp(dashboard_assets[i].name, name)) return &dashboard_assets[i];
    return NULL;
}

enum MHD_Result dashboard_route(struct MHD_Connection *c, const char *url, const char *method, bool *handled)
{
    *handled = false;
    size_t i = 0;
    while (i < sizeof routes / sizeof routes[0] && strcmp(url, routes[i].path)) i++;
    if (i == sizeof routes / sizeof routes[0]) return MHD_NO;
    *handled = true;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return http_send_error(c, 405, "method not allowed here", NULL, NULL);
    const dashboard_asset *a = asset_named(routes[i].file);
    if (!a) return http_send_error(c, 404, "no such file", NULL, NULL);
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    bool same = inm && !strcmp(inm, a->etag);
    /* The table is static: libmicrohttpd reads it in place. */
    struct MHD_Response *r = MHD_create_response_from_buffer(same ? 0 : a->size, same ? NULL : (void *)a->data,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", routes[i].type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "ETag", a->etag);
    MHD_add_response_header(r, "Content-Security-Policy", DASHBOARD_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    enum MHD_Result ret = MHD_queue_response(c, same ? 304 : 200, r);
    MHD_destroy_response(r);
    return ret;
}
