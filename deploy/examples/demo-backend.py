#!/usr/bin/env python3
"""A demo backend for the local stack: registers itself in Nacos or Consul,
then answers every GET with `hello from NAME`.

Used by docker-compose.yml (two containers, one per registry) and by the
e2e test that runs the same topology with local binaries
(e2e/tests/local_stack.rs). Standard library only.

Environment:
  NAME       service name to register (default: demo)
  PORT       port to listen on (default: 8080)
  REGISTRY   nacos or consul
  NACOS      Nacos address host:port (default: nacos:8848)
  CONSUL     Consul address host:port (default: consul:8500)
  ADVERTISE  address to register (default: this host's address)
"""

import http.server
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request

NAME = os.environ.get("NAME", "demo")
PORT = int(os.environ.get("PORT", "8080"))
REGISTRY = os.environ.get("REGISTRY", "")
NACOS = os.environ.get("NACOS", "nacos:8848")
CONSUL = os.environ.get("CONSUL", "consul:8500")


def advertised():
    explicit = os.environ.get("ADVERTISE")
    if explicit:
        return explicit
    return socket.gethostbyname(socket.gethostname())


def register_nacos(address):
    # A persistent instance (ephemeral=false): no heartbeats needed.
    query = urllib.parse.urlencode({
        "serviceName": NAME, "groupName": "DEFAULT_GROUP", "namespaceId": "public",
        "ip": address, "port": PORT, "ephemeral": "false", "healthy": "true", "enabled": "true",
    })
    req = urllib.request.Request(f"http://{NACOS}/nacos/v1/ns/instance?{query}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


def register_consul(address):
    body = json.dumps({
        "ID": f"{NAME}-{address}-{PORT}", "Name": NAME, "Address": address, "Port": PORT,
        "Check": {"HTTP": f"http://{address}:{PORT}/", "Interval": "5s", "Timeout": "2s",
                  "Status": "passing"},
    }).encode()
    req = urllib.request.Request(f"http://{CONSUL}/v1/agent/service/register", data=body, method="PUT")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


def register_until_done():
    register = {"nacos": register_nacos, "consul": register_consul}.get(REGISTRY)
    if register is None:
        print(f"REGISTRY must be nacos or consul, not {REGISTRY!r}", file=sys.stderr)
        os._exit(2)
    address = advertised()
    # The registry may still be starting: retry until it takes us.
    while True:
        try:
            register(address)
            print(f"registered {NAME} at {address}:{PORT} in {REGISTRY}", flush=True)
            return
        except OSError as e:
            print(f"registering in {REGISTRY}: {e}; retrying", file=sys.stderr, flush=True)
            time.sleep(1)


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {NAME}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Hello)
    threading.Thread(target=register_until_done, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
