"""A service replica for the UI's isolation test (standard library): ``/`` is an HTML page whose script
tries to act with the rights of whoever opens it -- read the UI's cookie and storage, call the API, read
a UI page, post a UI form -- and writes what happened into ``<body data-results>``. ``/health``: 200."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"""<!doctype html><html lang="en"><head><title>service</title></head><body>
<h1>A service</h1>
<script>
const out = {};
async function attempt(name, fn) {
  try { out[name] = await fn(); } catch (e) { out[name] = "blocked: " + e.name; }
}
(async () => {
  await attempt("cookie", () => document.cookie);
  await attempt("storage", () => String(window.localStorage.length));
  await attempt("api", async () => {
    const r = await fetch("/api/users/list", {method: "POST", credentials: "include",
      headers: {"Content-Type": "application/json"}, body: "{}"});
    return "status " + r.status + " " + (await r.text()).slice(0, 80);
  });
  await attempt("ui_page", async () => {
    const r = await fetch("/users", {credentials: "include"});
    return "status " + r.status + " " + (await r.text()).slice(0, 80);
  });
  await attempt("ui_form", async () => {
    await fetch("/users/create", {method: "POST", mode: "no-cors", credentials: "include",
      headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "username=evil&global_role=admin"});
    return "sent";
  });
  await attempt("parent", () => String(window.opener && window.opener.location.href));
  document.body.dataset.results = JSON.stringify(out);
})();
</script></body></html>"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body, ctype = (b"ok", "text/plain") if self.path.startswith("/health") else (PAGE, "text/html")
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
