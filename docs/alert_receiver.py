"""A Runwarden alert receiver: checks X-Runwarden-Signature, refuses replays older than 5 minutes."""
import hashlib, hmac, os, sys, time  # noqa: E401
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET = os.environ["RUNWARDEN_ALERT_SECRET"].encode()


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        sig = dict(p.split("=", 1) for p in self.headers.get("X-Runwarden-Signature", "").split(",") if "=" in p)
        t = sig.get("t", "")
        good = hmac.new(SECRET, t.encode() + b"." + body, hashlib.sha256).hexdigest()
        ok = t.isdigit() and abs(time.time() - int(t)) <= 300 and hmac.compare_digest(good, sig.get("v1", ""))
        if ok:  # handle it (here: print it), then answer. The Idempotency-Key is the same on every retry
            print(self.headers["Idempotency-Key"], body.decode(), flush=True)
        self.send_response(204 if ok else 401)
        self.end_headers()


server = HTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8125), Receiver)
print("listening", server.server_port, flush=True)
server.serve_forever()
