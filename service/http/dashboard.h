/*
 * dashboard.h — the web dashboard `ckpt serve` answers at "/": one HTML
 * page, one script and one style sheet (service/http/dashboard/), compiled
 * into the binary by service/http/dashboard/embed.sh.
 *
 *   GET|HEAD /                   index.html
 *   GET|HEAD /assets/app.js      app.js
 *   GET|HEAD /assets/app.css     app.css
 *
 * The page needs no token to load: it holds no data. Everything it shows
 * comes from the JSON API (/v1/...) with the token the user types into the
 * page, which keeps it in sessionStorage and sends it as the Authorization
 * header, never in a URL. Answers carry a strict Content-Security-Policy
 * (this origin only: no inline script, no other host), nosniff, no framing,
 * no referrer, "Cache-Control: no-cache" and an ETag (the file's sha256
 * prefix) so a browser revalidates and a new binary's page is never stale.
 */
#ifndef CKPT_SERVICE_HTTP_DASHBOARD_H
#define CKPT_SERVICE_HTTP_DASHBOARD_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *name; /* file name in service/http/dashboard/ */
    const unsigned char *data;
    size_t size;
    const char *etag; /* quoted */
} dashboard_asset;

/* The generated table (embed.sh). */
extern const dashboard_asset dashboard_assets[];
extern const size_t dashboard_asset_count;

/* Answers url when it is the dashboard's ("/" or "/assets/..."); *handled
 * false otherwise. Only GET and HEAD (405). */
enum MHD_Result dashboard_route(struct MHD_Connection *c, const char *url, const char *method, bool *handled);

#endif
